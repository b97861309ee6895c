"""The dialects, registered in one place: a new one is its document in openapi/, its module
here (translator and operations) and one line below."""

from gateway.dialects import aleph_alpha, azure, lmi, openai, ovms
from gateway.dialects.dialect import Dialect

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect
    for dialect in (openai.DIALECT, azure.DIALECT, aleph_alpha.DIALECT, lmi.DIALECT, ovms.DIALECT)
}

__all__ = ["DIALECTS", "Dialect"]
