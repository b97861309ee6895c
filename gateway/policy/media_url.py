"""An http(s) image URL read once, strictly, and written back from the parts that were read.

What the gateway screens and what an upstream later fetches must be the same host. URL parsers
disagree at the edges (`http://127.0.0.1\\@8.8.8.8/` is host 8.8.8.8 to Python's urlsplit and
127.0.0.1 to urllib3 and to WHATWG's URL), so the edges are refused or settled here:

- refused as malformed: control characters (WHATWG drops tabs and newlines), backslashes (WHATWG
  reads them as `/`), user information (`user:password@host`);
- settled: a host that WHATWG reads as an IPv4 address (`0x7f.1`, `2130706433`, `0177.0.0.1`,
  `127.1`) becomes that address; a name becomes its lower-case ASCII (IDNA) form; anything else
  in the host (`%`, spaces) makes it unreadable;
- the URL passed on is `ImageURL.text`, rebuilt from scheme, host, port, path and query (the
  path and query percent-encoded, the fragment, which no server sees, dropped).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import quote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
DECIMAL, OCTAL, HEX = re.compile(r"[0-9]+"), re.compile(r"[0-7]*"), re.compile(r"[0-9a-f]*")
# what a path or query keeps as it is: RFC 3986's unreserved and sub-delims, ':', '@', '/', '%'
# (an escape already made); everything else, spaces and non-ASCII included, is percent-encoded
KEPT_IN_PATH = "/:@!$&'()*+,;=-._~%"
KEPT_IN_QUERY = KEPT_IN_PATH + "?"


class Malformed(ValueError):
    """Not an http(s) URL the gateway passes on in any form (400)."""


class Unreadable(ValueError):
    """A URL of the right shape whose host (or port) names nothing that can be reached (403)."""


class FetchFailed(Exception):
    """The image could not be fetched (422; the message says why)."""


class TooLarge(Exception):
    """The image is larger than the bytes the fetch was allowed (413)."""


@dataclass(frozen=True)
class ImageURL:
    scheme: str  # "http" or "https"
    host: str  # a lower-case ASCII name, or an address in its standard form
    address: IPAddress | None  # the host, when it is an address
    port: int | None
    target: str  # path and query, percent-encoded; at least "/"

    @property
    def text(self) -> str:
        """The URL as it is passed on or fetched."""
        host = self.host
        if isinstance(self.address, ipaddress.IPv6Address):
            host = f"[{host.replace('%', '%25')}]"
        port = "" if self.port is None else f":{self.port}"
        return f"{self.scheme}://{host}{port}{self.target}"


def parse_image_url(url: str) -> ImageURL:
    """The URL's parts, or Malformed / Unreadable saying why not."""
    if CONTROL.search(url):
        raise Malformed("The image URL contains a control character.")
    if "\\" in url:
        raise Malformed("The image URL contains a backslash.")
    scheme, separator, rest = url.partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in ("http", "https"):
        raise Malformed("The image URL is not an http:// or https:// URL.")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, remainder = rest[:end], rest[end:]
    if "@" in authority:
        raise Malformed("The image URL may not contain user information (user:password@).")
    host_text, port = split_port(authority)
    address, host = read_host(host_text)
    return ImageURL(scheme, host, address, port, target(remainder))


def split_port(authority: str) -> tuple[str, int | None]:
    if authority.startswith("["):
        host, bracket, after = authority.partition("]")
        host += bracket
    else:
        host, colon, after = authority.partition(":")
        after = colon + after
    if not host:
        raise Malformed("The image URL has no host.")
    if not after:
        return host, None
    if not after.startswith(":") or not DECIMAL.fullmatch(after[1:] or "0"):
        raise Malformed("The image URL's port is not a number.")
    if not after[1:]:
        return host, None
    port = int(after[1:])
    if port > 65535:
        raise Unreadable(f"The image URL's port {port} is out of range.")
    return host, port


def read_host(text: str) -> tuple[IPAddress | None, str]:
    """(the address, if it is one; the host as it is passed on)."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise Unreadable(f"The image URL's host '{text}' is not an address.")
        try:  # a zone is written %25 in a URL (RFC 6874)
            address = ipaddress.IPv6Address(text[1:-1].replace("%25", "%"))
        except ValueError:
            raise Unreadable(f"The image URL's host '{text}' is not an address.") from None
        return address, str(address)
    try:
        name = text.encode("idna").decode("ascii").lower() if not text.isascii() else text.lower()
    except UnicodeError:
        raise Unreadable(f"The image URL's host '{text}' is not a name.") from None
    ipv4 = whatwg_ipv4(name)
    if ipv4 is not None:
        return ipv4, str(ipv4)
    labels = name.removesuffix(".").split(".")
    if len(name) > 253 or not all(LABEL.fullmatch(label) for label in labels):
        raise Unreadable(f"The image URL's host '{text}' is not a name.")
    return None, name


def whatwg_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address WHATWG's URL parser reads a host as when its last label is a number (decimal,
    0x-hex or 0-octal, 1 to 4 parts: `127.1`, `0x7f000001`); None for a name."""
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not DECIMAL.fullmatch(parts[-1]) and ipv4_number(parts[-1]) is None:
        return None
    numbers = [ipv4_number(part) for part in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise Unreadable(f"The image URL's host '{host}' is not an IPv4 address.")
    *leading, last = [n for n in numbers if n is not None]
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        raise Unreadable(f"The image URL's host '{host}' is not an IPv4 address.")
    value = last + sum(n * 256 ** (3 - i) for i, n in enumerate(leading))
    return ipaddress.IPv4Address(value)


def ipv4_number(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, pattern, radix = part[2:], HEX, 16
    elif len(part) > 1 and part.startswith("0"):
        digits, pattern, radix = part[1:], OCTAL, 8
    else:
        digits, pattern, radix = part, DECIMAL, 10
    if not part or not pattern.fullmatch(digits.lower()):
        return None
    return int(digits, radix) if digits else 0


def target(remainder: str) -> str:
    """Path and query, percent-encoded, without the fragment."""
    remainder = remainder.partition("#")[0]
    path, question, query = remainder.partition("?")
    path = quote(path, safe=KEPT_IN_PATH, errors="surrogatepass") or "/"
    if question:
        return f"{path}?{quote(query, safe=KEPT_IN_QUERY, errors='surrogatepass')}"
    return path
