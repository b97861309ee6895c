"""What chatgate takes from the process environment, read once where the settings are loaded
(gateway/config/source.py) and carried by them (`Settings.environment`): code below the settings
never reads `os.environ` (a test keeps it so).

Libraries that read their own variables by convention still do: prometheus_client its
multiprocess folder, OpenTelemetry's OTLP exporter its `OTEL_EXPORTER_OTLP_*`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CONFIG = "CHATGATE_CONFIG"  # the config file the ASGI factory (gateway/asgi.py) serves
ACCESS_LOG = "CHATGATE_ACCESS_LOG"  # "1": the ASGI factory writes the access log to stdout
METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set: the workers' metrics are added up through files
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"  # set and not "none": tracing is on
SERVICE_NAME = "OTEL_SERVICE_NAME"  # the traces' service.name, over the config's
PROXY_VARIABLES = tuple(
    name for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy") for name in (base, base.upper())
)  # read for a backend's `proxy: env`, as curl and urllib read them


@dataclass(frozen=True, slots=True)
class Environment:
    config_path: str | None = None
    access_log: bool = False
    metrics_dir: str | None = None
    traces_exporter: str = ""  # lower case, "" when unset
    service_name: str | None = None
    proxies: Mapping[str, str] = field(default_factory=dict)  # the proxy variables that are set

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Environment:
        return cls(
            config_path=environ.get(CONFIG) or None,
            access_log=environ.get(ACCESS_LOG) == "1",
            metrics_dir=environ.get(METRICS_DIR) or None,
            traces_exporter=environ.get(TRACES_EXPORTER, "").strip().lower(),
            service_name=environ.get(SERVICE_NAME) or None,
            proxies={name: environ[name] for name in PROXY_VARIABLES if name in environ},
        )

    @property
    def tracing_asked(self) -> bool:
        """Whether the OpenTelemetry variables ask for traces (the config may too)."""
        return self.traces_exporter not in ("", "none")
