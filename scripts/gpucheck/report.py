"""Result rows on disk, a call's summary and tarball, the table, the
report of a machine's rows and the merge of several calls' summaries."""
import json
import os
import re
import tarfile
import time


def read_rows(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue  # a row cut short by a kill
    return rows


def append_row(path, row):
    """One row at the end of a JSON lines file, at once (a stage cut short
    keeps the rows it measured)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def put_row(path, row):
    """`row` into the JSON lines of `path`, in place of a row of its case."""
    rows = [r for r in read_rows(path) if r.get("case") != row.get("case")]
    rows.append(row)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# ---- the table --------------------------------------------------------------------

HEADLINE_CASES = re.compile(r"^(peak_|step_gemms_)")


def row_line(stage, r):
    verdict = {True: "PASS", False: "FAIL"}.get(r.get("pass"), "    ")
    keys = [k for k in r if k not in ("case", "pass", "suite", "missed", "why")][:6]
    keys += [k for k in ("missed", "why") if k in r]
    return f"  {verdict} {stage:8} {r.get('case', '?'):34} " + ", ".join(f"{k}={r[k]}" for k in keys)


def print_rows(stage, rows, compact=False):
    """The table's lines of one stage; the number of rows that failed.
    compact (the summary a call prints last): every failed row; the passed
    ones and the measurements only while there are few (else a count, and
    the headline measurements: the GEMM peak and step rows)."""
    failed = sum(r.get("pass") is False for r in rows)
    passed = [r for r in rows if r.get("pass") is True]
    plain = [r for r in rows if "pass" not in r]
    left_out = 0
    for r in rows:
        if compact and ((r in passed and len(passed) > 6) or
                        (r in plain and len(plain) > 8 and not HEADLINE_CASES.match(r.get("case", "")))):
            left_out += 1
            continue
        print(row_line(stage, r))
    if left_out:
        print(f"  .... {stage:8} {left_out} more rows (passed, or measurements): gpu_check_summary.json")
    return failed


# ---- one call ---------------------------------------------------------------------

def call_summary(state_dir, stages, commit, device, machine, libraries, tarball, seconds, deadline, final):
    """One call's summary. stages: [(name, status, seconds, note, limit)].
    Each stage's status (plan.STATUSES), seconds, note, limit (where it
    started) and result rows;
    "result": pass (every stage passed, every judged row too), fail (a
    stage failed or a row missed its target), or incomplete (else: a stage
    timed out, was interrupted, skipped or has not run yet)."""
    entries = {}
    for name, status, secs, note, limit in stages:
        entry = {"status": status, "seconds": int(secs)}
        if note:
            entry["note"] = note
        if limit:
            entry["limit_s"] = limit
        if status not in ("pending", "skipped") and name != "report":
            entry["rows"] = read_rows(os.path.join(state_dir, f"{name}.jsonl"))
        entries[name] = entry
    rows_failed = any(r.get("pass") is False for e in entries.values() for r in e.get("rows", []))
    if any(e["status"] == "fail" for e in entries.values()) or rows_failed:
        result = "fail"
    elif all(e["status"] == "pass" for e in entries.values()):
        result = "pass"
    else:
        result = "incomplete"
    return {"commit": commit, "device": device, "machine": machine, "libraries": libraries,
            "stages_asked": list(entries), "result": result, "final": final, "seconds": int(seconds),
            "deadline_s": deadline, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tarball": tarball, "stages": entries}


def describe_cudnn(libraries):
    c = (libraries or {}).get("cudnn") or {}
    return f"cuDNN {c.get('version') or ''} ({c.get('from')})".replace("  ", " ") if c else ""


def print_summary(s):
    gpu = (s.get("machine") or {}).get("gpu") or s.get("device")
    cudnn = describe_cudnn(s.get("libraries"))
    print(f"gpu_check summary: {s['result'].upper()}, stages {' '.join(s['stages_asked'])}, commit {s['commit']}, "
          f"{gpu}, {s['seconds']} s" + (f", {cudnn}" if cudnn else ""))
    for stage, e in s["stages"].items():
        note = f" ({e['note']})" if e.get("note") else ""
        print(f"  {e['status']:11} {stage:8} {e['seconds']:4d} s{note}")
        print_rows(stage, e.get("rows", []), compact=True)


# ---- the tarball ------------------------------------------------------------------

PACKED = (".log", ".jsonl", ".json", ".tsv", ".txt")
TARBALL_MAX_BYTES = 15 << 20  # a file handed back may be 16 MiB


def call_files(state_dir, since):
    """This call's text files in the results folder: logs, result rows,
    run metrics (no checkpoints, nothing binary), newer than `since`."""
    found = []
    for top, dirs, files in os.walk(state_dir):
        dirs[:] = sorted(d for d in dirs if not (top == state_dir and d == "out"))
        for name in sorted(files):
            path = os.path.join(top, name)
            if name.endswith(PACKED) and not name.endswith(".tmp") and os.stat(path).st_mtime >= since:
                found.append(os.path.relpath(path, state_dir))
    return found


def trim_log(path, over, head, tail):
    """A log over `over` bytes keeps its first `head` and last `tail` bytes."""
    size = os.path.getsize(path)
    if not path.endswith(".log") or size <= over:
        return
    with open(path, "rb") as f:
        first = f.read(head)
        f.seek(size - tail)
        last = f.read()
    with open(path + ".trim", "wb") as f:
        f.write(first + f"\n[gpu_check: {size} bytes; the middle was cut]\n".encode() + last)
    os.replace(path + ".trim", path)


def pack(state_dir, since, dest):
    """This call's files into the tarball `dest`. A log over 4 MiB keeps its
    first 1 MiB and last 3 MiB; should the tarball still pass 15 MiB, every
    log over 1 MiB its first 256 KiB and last 768 KiB."""
    tmp = os.path.join(state_dir, ".pack.tar.gz")
    for over, head, tail in ((4 << 20, 1 << 20, 3 << 20), (1 << 20, 256 << 10, 768 << 10)):
        files = call_files(state_dir, since)
        for f in files:
            trim_log(os.path.join(state_dir, f), over, head, tail)
        with tarfile.open(tmp, "w:gz") as tar:
            for f in files:
                try:
                    tar.add(os.path.join(state_dir, f), arcname=f, recursive=False)
                except OSError:
                    continue  # removed while packing
        if os.path.getsize(tmp) <= TARBALL_MAX_BYTES:
            break
    os.replace(tmp, dest)


# ---- several calls, and a machine's rows ------------------------------------------

def report(state_dir, out_json, commit):
    """Every STAGE.jsonl of the results folder in one file, and the table; 1 when a row failed."""
    result = {"commit": commit, "stages": {}}
    for name in sorted(os.listdir(state_dir)):
        if name.endswith(".jsonl"):
            result["stages"][name[:-len(".jsonl")]] = read_rows(os.path.join(state_dir, name))
    write_json(out_json, result)
    print(f"gpu_check report, commit {commit}: {out_json}")
    failed = sum(print_rows(stage, rows) for stage, rows in result["stages"].items())
    return 1 if failed else 0


def merge(out_json, summaries):
    """Several calls' summaries in one report: the last run of each stage;
    1 when a stage did not pass, a row failed or the calls measured
    different commits."""
    result = {"commit": None, "machine": None, "libraries": None, "calls": [], "stages": {}}
    commits = []
    for path in summaries:
        with open(path) as f:
            s = json.load(f)
        commits.append(s.get("commit", "unknown"))
        result["machine"] = s.get("machine") or result["machine"]
        result["libraries"] = s.get("libraries") or result["libraries"]
        call = {k: s.get(k) for k in ("stages_asked", "result", "final", "seconds", "finished_at")}
        call["status"] = {st: e["status"] for st, e in s.get("stages", {}).items()}
        result["calls"].append(call)
        for stage, e in s.get("stages", {}).items():
            if e["status"] not in ("pending", "skipped") and stage != "report":
                result["stages"][stage] = e.get("rows", []) + ([] if e["status"] == "pass" else [
                    {"case": f"{stage}_stage", "pass": False, "status": e["status"], "note": e.get("note", "")}])
    result["commit"] = commits[-1] if len(set(commits)) == 1 else ",".join(commits)
    write_json(out_json, result)
    print(f"gpu_check merge of {len(summaries)} call(s), commit {result['commit']}: {out_json}")
    failed = sum(print_rows(stage, rows) for stage, rows in result["stages"].items())
    if len(set(commits)) > 1:
        print("gpu_check merge: the calls measured different commits")
        failed += 1
    return 1 if failed else 0
