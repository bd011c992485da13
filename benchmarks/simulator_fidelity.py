"""How faithfully the allocator simulator reproduces real torch traces.

    python benchmarks/simulator_fidelity.py CORPUS_DIR

For every snapshot under CORPUS_DIR/snapshots (or CORPUS_DIR itself when it holds the snapshots),
each device trace whose history starts from an empty allocator is replayed through
oomdoctor.rehearse's simulator (see oomdoctor/rehearse/allocator_fidelity.py for the rules). Per
file it prints the share of segment events (segment_alloc / segment_map sizes, in order) and of
final blocks ((size, state, requested_size) per segment, addresses relabelled) that match, and why
the other traces do not qualify. The last line is `agreement: X`: matched segment events plus matched final blocks,
over their totals, across all qualifying traces.

cudaMalloc's choice of address belongs to the CUDA driver, not to the caching allocator, yet best
fit breaks ties between equal free blocks by lowest address. The replay therefore gives the
simulator the address torch recorded for each segment (TracedAddressSpace); the line before last
shows the agreement when the simulator places segments itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oomdoctor.errors import OomdoctorError  # noqa: E402
from oomdoctor.load import load  # noqa: E402
from oomdoctor.rehearse.allocator_fidelity import DeviceReplay, replay_snapshot  # noqa: E402


def snapshot_files(corpus_dir: Path) -> list[Path]:
    folder = corpus_dir / "snapshots" if (corpus_dir / "snapshots").is_dir() else corpus_dir
    return sorted(p for p in folder.iterdir() if p.is_file())


def replay_file(path: Path, traced_addresses: bool = True) -> list[DeviceReplay] | str:
    try:
        snapshot = load(path)  # the project's safe loader: no globals, size-capped
    except OomdoctorError as error:
        return f"unreadable ({error})"
    if not any(len(trace) for trace in snapshot.traces):
        return f"no trace events ({snapshot.source_format})"
    return replay_snapshot(snapshot, traced_addresses)


def _share(matched: int, total: int) -> str:
    return f"{matched}/{total} ({matched / total:.3f})" if total else "-"


def _first_fit_agreement(corpus_dir: Path) -> float:
    matched = total = 0
    for path in snapshot_files(corpus_dir):
        outcome = replay_file(path, traced_addresses=False)
        for replay in outcome if not isinstance(outcome, str) else []:
            if replay.qualifies:
                matched += replay.segment_events_matched + replay.blocks_matched
                total += replay.segment_events_total + replay.blocks_total
    return matched / total if total else 0.0


def run(corpus_dir: Path, out=sys.stdout) -> float:
    segment_matched = segment_total = block_matched = block_total = 0
    for path in snapshot_files(corpus_dir):
        outcome = replay_file(path)
        if isinstance(outcome, str):
            print(f"{path.name}: skipped, {outcome}", file=out)
            continue
        for replay in outcome:
            scope = "" if replay.scope == "all pools" else f", {replay.scope} only"
            label = f"{path.name} [device {replay.device}{scope}]"
            if not replay.qualifies:
                print(f"{label}: skipped, {replay.reason}", file=out)
                continue
            segment_matched += replay.segment_events_matched
            segment_total += replay.segment_events_total
            block_matched += replay.blocks_matched
            block_total += replay.blocks_total
            print(
                f"{label}: segment events {_share(replay.segment_events_matched, replay.segment_events_total)}, "
                f"final blocks {_share(replay.blocks_matched, replay.blocks_total)}, "
                f"segment releases {_share(replay.release_events_matched, replay.release_events_total)}",
                file=out,
            )
            if replay.simulated_retries or replay.simulated_ooms:
                print(
                    f"    on its own the simulator flushed and retried {replay.simulated_retries} time(s) and ran "
                    f"out of memory {replay.simulated_ooms} time(s) (torch's trace: {replay.real_ooms} oom)",
                    file=out,
                )
            for note in replay.mismatches:
                print(f"    {note}", file=out)
    print(f"segment events: {_share(segment_matched, segment_total)}", file=out)
    print(f"final blocks: {_share(block_matched, block_total)}", file=out)
    print(
        "with the simulator's own first-fit segment addresses instead of the driver's: "
        f"{_first_fit_agreement(corpus_dir):.4f} (best fit breaks ties by address)",
        file=out,
    )
    total = segment_total + block_total
    agreement = (segment_matched + block_matched) / total if total else 0.0
    print(f"agreement: {agreement:.4f}", file=out)
    return agreement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_dir", type=Path)
    args = parser.parse_args(argv)
    if not args.corpus_dir.is_dir():
        print(f"not a folder: {args.corpus_dir}", file=sys.stderr)
        return 2
    run(args.corpus_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
