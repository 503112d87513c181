#!/usr/bin/env python3
"""Loads a run directory's TensorBoard event files with TensorBoard itself.

    tests/check_tensorboard.py RUN_DIR [--expect-scalars TAG=COUNT ...]
                                       [--expect-text TAG ...]

Prints every scalar tag with its point count, first and last point, and every
text tag with its first string, as TensorBoard's own EventAccumulator reads
them (it checks the TFRecord CRCs and parses the Event protos). Exits 1 when
there is no scalar at all or an expectation fails, 2 when tensorboard is not
installed (pip install tensorboard). Needs only the tensorboard package, not
TensorFlow.
"""

import argparse
import glob
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="directory holding events.out.tfevents.* files")
    parser.add_argument("--expect-scalars", nargs="*", default=[], metavar="TAG=COUNT",
                        help="scalar tags that must have exactly COUNT points")
    parser.add_argument("--expect-text", nargs="*", default=[], metavar="TAG",
                        help="text tags that must be present")
    args = parser.parse_args()

    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util import tensor_util
    except ImportError as e:
        print(f"check_tensorboard: cannot import tensorboard ({e}); pip install tensorboard",
              file=sys.stderr)
        return 2

    files = sorted(glob.glob(os.path.join(args.run_dir, "events.out.tfevents.*")))
    if not files:
        print(f"check_tensorboard: no events.out.tfevents.* file in '{args.run_dir}'", file=sys.stderr)
        return 1
    for f in files:
        print(f"event file: {f} ({os.path.getsize(f)} bytes)")

    # size_guidance 0: keep every point, so the counts are exact.
    acc = EventAccumulator(args.run_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    if acc.file_version is None:
        print("check_tensorboard: no file_version event", file=sys.stderr)
        return 1
    print(f"file version: {acc.file_version}")

    counts = {}
    for tag in sorted(tags.get("scalars", [])):
        points = acc.Scalars(tag)
        counts[tag] = len(points)
        first, last = points[0], points[-1]
        print(f"scalar {tag}: {len(points)} points, step {first.step} = {first.value:g}"
              f" ... step {last.step} = {last.value:g}")

    texts = {}
    try:
        text_tags = set(acc.PluginTagToContent("text"))
    except KeyError:  # no value carries the text plugin's metadata
        text_tags = set()
    for tag in sorted(text_tags):
        events = acc.Tensors(tag)
        value = tensor_util.make_ndarray(events[0].tensor_proto)
        text = value.item() if value.shape == () else value.flat[0]
        texts[tag] = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        print(f"text {tag}: {len(events)} strings, step {events[0].step} = {texts[tag]!r}")

    failures = []
    if not counts:
        failures.append("no scalar tags")
    for expect in args.expect_scalars:
        tag, _, count = expect.rpartition("=")
        if counts.get(tag) != int(count):
            failures.append(f"scalar {tag}: expected {count} points, found {counts.get(tag, 0)}")
    for tag in args.expect_text:
        if tag not in texts:
            failures.append(f"text {tag}: not found (text tags: {sorted(texts)})")
    for failure in failures:
        print(f"check_tensorboard: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
