"""The PNG pictures this package draws (`titan-autopar show`, `ab`'s ab.png): written whole,
and marked so that a later run knows them again.

`save_png(fig, path, title)` renders a matplotlib figure with `title` in the PNG's "Title" text
chunk and writes it with `files.write_atomic`. `png_titled(path, title)` is the recogniser the
guard (`files.check_out_file`) takes: a regular file that is a PNG whose header chunks carry
that title; any other picture of the same name is the user's.
"""

from __future__ import annotations

import io
import struct

from titan_autopar.files import FileRefused, read_capped, write_atomic

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_BYTES = 64 << 20  # far above any picture drawn here


def save_png(fig, path, title: str, dpi: int = 100):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Title": title})
    return write_atomic(path, buf.getvalue())


def png_titled(path, title: str) -> bool:
    """True if `path` is a PNG whose "Title" text chunk (before the image data) is `title`."""
    try:
        data = read_capped(path, name=str(path), what="a picture", fix="", limit=_MAX_BYTES)
    except FileRefused:
        return False
    if not data.startswith(_SIGNATURE):
        return False
    at = len(_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IDAT" or len(body) < length:
            return False
        if kind == b"tEXt" and body == b"Title\0" + title.encode("latin-1"):
            return True
        at += 12 + length  # length, type, body, crc
    return False
