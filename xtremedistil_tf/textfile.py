"""Text files, one text a line: every command's one reader of them (bin/predict, an export's predict.py, bin/train's
--transfer_file, the labeled data files of every format).

Standard library only: ONNX and TFLite exports ship this file beside predict.py (export/portable.py), which reads it
without importing the package (whose import loads TensorFlow).
"""
from __future__ import annotations

import codecs
import sys
from typing import Optional

# The longest line a text file may have (bytes of UTF-8, characters of UTF-16/32): one text or sentence a line is far
# shorter; a file past it is not such text (a binary, or text with no line breaks), refused before it fills memory.
LINE_LIMIT = 1 << 20
# Byte-order marks, longest first (UTF-32 LE starts as UTF-16 LE's does).
BOMS = ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\xef\xbb\xbf", "utf-8"),
        (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))

# Compressed and archive files by their first bytes: named as such rather than as a binary's NUL or invalid UTF-8.
PACKED = ((b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"\xfd7zX", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
          *((b"BZh%d" % level, "bzip2") for level in range(1, 10)))


class TextError(ValueError):
    """A text file that is not one text a line: `str()` is "<name>:<line>: <problem>" ("<name>: <problem>" without a
    line)."""

    def __init__(self, name, line: Optional[int], problem: str):
        super().__init__(f"{name}:{line}: {problem}" if line is not None else f"{name}: {problem}")
        self.name, self.line, self.problem = str(name), line, problem


def text_lines(stream, name, strict: bool = False, limit: int = LINE_LIMIT):
    """(line number, text) of each line of the binary `stream`, read a line at a time (memory bounded by `limit`),
    every command's one reader of text (bin/predict, this file's `main`, --transfer_file, the data files):

    - UTF-8, with or without a byte-order mark, or UTF-16 / UTF-32 with theirs (what "Unicode" means to Notepad);
    - split at "\\n" only: a line's final "\\r" is dropped, a "\\r" inside it stays in its text;
    - a NUL character, or a line past `limit`, is a TextError naming the line: a binary file, not text (a
      compressed one is named as such);
    - invalid bytes: a TextError naming the line and column when `strict`, else replaced by U+FFFD as
      bytes.decode(errors="replace") does (the text the offsets index), with one note on stderr at the end naming
      the first such line of `name`."""
    head = stream.read(4)
    for magic, kind in PACKED:
        if head.startswith(magic):
            raise TextError(name, 1, f"{kind}-compressed (it starts with {kind}'s bytes {magic.hex(' ')}); "
                                     "expected text, one a line: decompress it first")
    encoding, skip = "utf-8", 0
    for bom, candidate in BOMS:
        if head.startswith(bom):
            encoding, skip = candidate, len(bom)
            break
    lines = _utf8_lines(head[skip:], stream, limit) if encoding == "utf-8" else \
        _decoded_lines(head[skip:], stream, encoding, name, strict, limit)
    replaced = []
    for number, line in enumerate(lines, 1):
        nul = line.find(b"\0" if isinstance(line, bytes) else "\0")
        if nul >= 0:
            raise TextError(name, number, f"NUL character (column {nul + 1}): a binary file (or UTF-16/32 without "
                                          "a byte-order mark), not text; expected UTF-8 text, one a line")
        if len(line) > limit and not line.endswith(b"\n" if isinstance(line, bytes) else "\n"):
            raise TextError(name, number, f"longer than {limit:,} {'bytes' if isinstance(line, bytes) else 'characters'}"
                                          " with no line break; expected text, one a line")
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as error:
                if strict:
                    raise TextError(name, number, f"invalid UTF-8 (byte 0x{line[error.start]:02x} at column "
                                                  f"{error.start + 1}); expected a UTF-8 text file") from None
                line = line.decode("utf-8", errors="replace")
                replaced.append(number)
        line = line[:-1] if line.endswith("\n") else line
        yield number, line[:-1] if line.endswith("\r") else line
    if replaced:
        more = f" (and {len(replaced) - 1} more lines)" if len(replaced) > 1 else ""
        print(f"note: {name}:{replaced[0]}{more}: invalid UTF-8, replaced by U+FFFD; offsets count each "
              "replacement character as one character", file=sys.stderr, flush=True)


def _utf8_lines(head: bytes, stream, limit: int):
    """The raw lines of `head` + `stream`, each with its "\\n"; one of more than `limit` bytes ends the lines."""
    buffer = head
    while True:
        newline = buffer.find(b"\n")
        if newline >= 0:
            yield buffer[:newline + 1]
            buffer = buffer[newline + 1:]
            continue
        more = stream.readline(limit + 1 - len(buffer)) if len(buffer) <= limit else b""
        if not more or len(buffer) + len(more) > limit and not more.endswith(b"\n"):
            if buffer + more:
                yield buffer + more
            return
        buffer += more


def _decoded_lines(head: bytes, stream, encoding: str, name, strict: bool, limit: int):
    """The lines (str, each with its "\\n") of UTF-16/32 `head` + `stream`, decoded in 64 KiB blocks."""
    decoder = codecs.getincrementaldecoder(encoding)("strict" if strict else "replace")
    pending, count, block = "", 0, head or stream.read(1 << 16)
    while True:
        try:
            pending += decoder.decode(block, final=not block)
        except UnicodeDecodeError:
            raise TextError(name, count + pending.count("\n") + 1, f"invalid {encoding.upper()[:6]} (after its "
                                                                    "byte-order mark); expected text") from None
        *complete, pending = pending.split("\n")
        for line in complete:
            yield line + "\n"
        count += len(complete)
        if len(pending) > limit or not block:
            if pending:
                yield pending
            return
        block = stream.read(1 << 16)
