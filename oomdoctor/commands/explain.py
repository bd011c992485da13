"""Read PyTorch out-of-memory messages from a log and say what they mean, when no dump exists.

    oomdoctor explain train.log
    kubectl logs trainer-0 | oomdoctor explain -
    oomdoctor explain --message "CUDA out of memory. Tried to allocate 20.00 MiB ..."
    oomdoctor explain train.log --format json

Finds every OOM message in the text, whatever the log did to it (line wrapping, [rankN]: and
logging prefixes, progress bars, truncation), and reads each format torch has written: CUDA and
ROCm from 0.x to 2.13, XPU, MPS, cudaMallocAsync, CUDA errors and wrappers such as accelerate's
batch-size finder; an OOM known only by its exception type; and what users paste instead of a
dump: torch.cuda.memory_summary()'s table, DeepSpeed's see_memory_usage lines and vLLM's memory
profiling lines (docs/explain.md). For each distinct message: what each figure means (sizes in bytes in JSON),
what follows from them (memory outside PyTorch, other processes, reserved-but-unallocated), a
likely verdict, what to do, and what a message cannot tell. The first message (or the first with
figures) is shown in full; the others in brief.

"Tried to allocate" is the segment the allocator asked the GPU for, not the tensor: up to 1 MiB
shows as 2.00 MiB, 1-10 MiB as 20.00 MiB, larger requests rounded up to 2 MiB. To see which tensor
and line ran out, record a dump: `import oomdoctor; oomdoctor.install()`.

Exit status: 0 explained, 2 no PyTorch OOM message (or another framework's, e.g. JAX or
TensorFlow), an unreadable file, or a dump given instead of a log (use `oomdoctor report`).
"""

from __future__ import annotations

import argparse
import sys

from oomdoctor.commands import add_file_argument, add_format_argument, add_width_argument, text_width
from oomdoctor.errors import OomdoctorError

MAX_LOG_BYTES = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_file_argument(parser, "a log or text holding the message; - for stdin", optional=True)
    parser.add_argument("--message", metavar="TEXT", help="the message itself instead of a file")
    add_format_argument(parser)
    add_width_argument(
        parser, "wrap text to N columns (default: COLUMNS if set, else the terminal's width on a terminal, else 100)"
    )


def _read(args: argparse.Namespace) -> tuple[str, str]:
    if args.message is not None:
        if args.file is not None:
            raise OomdoctorError("give either FILE or --message, not both")
        return args.message, "the message given"
    if args.file is None:
        raise OomdoctorError("nothing to explain: give a log FILE, - for stdin, or --message TEXT")
    if args.file == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
        source = "standard input"
    else:
        try:
            with open(args.file, "rb") as handle:
                data = handle.read(MAX_LOG_BYTES + 1)
        except OSError as error:
            raise OomdoctorError(f"{args.file}: cannot read ({error.strerror or error})") from None
        source = args.file
    if len(data) > MAX_LOG_BYTES:
        raise OomdoctorError(f"{source}: larger than 1 GiB; pass the part of the log around the error")
    if data[:1] == b"\x80" or data[:2] == b"\x1f\x8b":
        raise OomdoctorError(f"{source}: a binary file (a dump?), not a log; for dumps use `oomdoctor report {source}`")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # Windows PowerShell redirects write UTF-16
        return data.decode("utf-16", errors="replace"), source
    if b"\x00" in data[:4096]:
        raise OomdoctorError(f"{source}: a binary file, not a text log")
    return data.decode("utf-8-sig", errors="replace"), source


def run(args: argparse.Namespace) -> int:
    from oomdoctor.messages import ForeignMessage, explain, find_messages
    from oomdoctor.messages.explain import highlight
    from oomdoctor.views.explain import WIDTH, to_json, to_text

    text, source = _read(args)
    if not text.strip():
        raise OomdoctorError(f"{source}: empty")
    try:
        messages = find_messages(text)
    except ForeignMessage as foreign:
        raise OomdoctorError(
            f"{source}: this is a {foreign.framework} out-of-memory message, not PyTorch's; oomdoctor explains PyTorch's"
        ) from None
    if not messages:
        raise OomdoctorError(
            f"{source}: no PyTorch out-of-memory message found (such as 'CUDA out of memory. Tried to allocate ...')"
        )
    explanations = [explain(message) for message in messages]
    index, reason = highlight(messages)
    if args.format == "json":
        sys.stdout.buffer.write(to_json(explanations, index, reason, source))
        sys.stdout.flush()
    else:
        sys.stdout.write(to_text(explanations, index, reason, source, width=text_width(args) or WIDTH))
    return 0
