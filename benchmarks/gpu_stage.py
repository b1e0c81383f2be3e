"""What travels to a lent GPU and what comes back from it (issue #60; benchmarks/README.md, "Runs on a lent GPU").

A device call carries the checkout's working tree (tracked files, untracked files git does not ignore) and the
git-ignored paths named in its ``carry``, 64 MiB in all; the machine keeps what earlier calls carried while it stays
warm (about 30 idle seconds). So the data travel in pieces, one piece a call, into the git-ignored ``stage/``:
CIFAR-10's six ~28 MB shards two a call (``a``, ``b``, then ``c``: the last training shard with the test shard), MNIST
in one (``m``), and what a previous call returned that must go out again (``r``: a run's state, earlier results).
Each piece holds its files at their place under the data root and a ``checksums.sha256`` of them (lines of the data's
own ``checksums.sha256``); the device checks every file against it before anything trains.

On this machine, before the calls (``--dry-run``: say what would be done, change nothing)::

    python benchmarks/gpu_stage.py stage tsai --data DATA                  # pieces a, b, c; prints the calls and sizes
    python benchmarks/gpu_stage.py stage tsai_resume --data DATA --resume DIR   # a, b, c and the state DIR returned
    python benchmarks/gpu_stage.py away                                    # the tracked checkpoints out of the tree

On the device (the staging calls' command; gpu_items.py checks all its pieces again before it trains)::

    python3 benchmarks/gpu_stage.py verify a

After the calls, on this machine::

    python benchmarks/gpu_stage.py back                                    # the checkpoints back into the tree
    python benchmarks/gpu_stage.py collect DIR [--dry-run]                 # re-check, register, record one call

``collect`` reads what one call returned (``DIR``: its files): every exported checkpoint is loaded (sha256 and bound
registry fields checked), evaluated again on this machine's CPU and compared with the error counts the device recorded;
when they agree, it is registered (``capsule_lib/checkpoints``: the weights, the history, the registry entry with a
note of the re-check, its ``bound_sha256`` recomputed) and the call is recorded in
``benchmarks/results/gpu_<item>_<device>.json``. ``--dry-run`` does all of it in a temporary copy of the registry (its
entries and histories) and says what it would write.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from capsule_lib.train.shipped import sha256_file  # noqa: E402

MIB = 2**20
#: what one device call may carry, the working tree included
CALL_LIMIT = 64 * MIB

#: the pieces of data: name -> the files it carries (paths under the data root, as its checksums.sha256 names them)
PIECES: dict[str, tuple[str, ...]] = {
    "a": ("cifar10/train_0.npz", "cifar10/train_1.npz"),
    "b": ("cifar10/train_2.npz", "cifar10/train_3.npz"),
    "c": ("cifar10/train_4.npz", "cifar10/test.npz"),
    "m": tuple(
        f"mnist/MNIST/raw/{f}-ubyte.gz"
        for f in ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")
    ),
}
#: each dataset's pieces
DATASETS: dict[str, tuple[str, ...]] = {"cifar10": ("a", "b", "c"), "mnist": ("m",)}
#: the piece of what a previous call returned and a later one needs: its files (globs) in the returned folder
RESUME, RESUME_FILES = "r", ("state.tar.part*", "meta.tar.gz")
#: tracked paths no device command needs, moved out of the checkout before the calls (``away``) and back after
AWAY = ("capsule_lib/checkpoints/*.pt", "book/_vendor")

_ITEMS = "python3 -u benchmarks/gpu_items.py"
#: each item's device calls, in order: (the pieces it carries, its command, its timeout_s). The calls of an item
#: follow one another at once (the machine forgets the pieces once it is given back); the last one trains.
CALLS: dict[str, list[tuple[tuple[str, ...], str, int]]] = {
    "tsai": [
        (("a",), "python3 benchmarks/gpu_stage.py verify a", 120),
        (("b",), "python3 benchmarks/gpu_stage.py verify b", 120),
        (("c",), f"{_ITEMS} tsai --budget 8", 600),
    ],
    "tsai_resume": [
        (("a",), "python3 benchmarks/gpu_stage.py verify a", 120),
        (("b",), "python3 benchmarks/gpu_stage.py verify b", 120),
        (("c",), "python3 benchmarks/gpu_stage.py verify c", 120),
        (("r",), f"{_ITEMS} tsai --budget 15 --minutes 8.5 --resume", 600),
    ],
    "critique": [(("m",), f"{_ITEMS} critique --minutes 8.5 --workers 4", 600)],
    "critique_resume": [(("m", "r"), f"{_ITEMS} critique --minutes 8.5 --workers 4 --resume", 600)],
    "plateau": [(("m",), f"{_ITEMS} speedrun 4.8 capsnet_speedrun --set seed=1 --tag gpu_seed1", 420)],
    "em": [((), f"{_ITEMS} speedrun 8.5 em_norb_speedrun", 600)],
    "multimnist": [(("m",), f"{_ITEMS} speedrun 8.5 capsnet_multimnist_speedrun", 600)],
    "epoch": [(("m",), f"{_ITEMS} speedrun 1.5 capsnet_speedrun --flops", 240)],
}


def fail(message: str, code: int = 2, prog: str = "gpu_stage.py") -> NoReturn:
    """One line on stderr, then exit ``code`` (2: the arguments; 3: the staged data)."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(code)


def read_checksums(path: Path) -> dict[str, str]:
    """``sha256sum`` lines -> ``{relative path: sha256}``."""
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def _write_checksums(folder: Path, sums: dict[str, str]) -> None:
    (folder / "checksums.sha256").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.lstat().st_size for f in path.rglob("*") if not f.is_dir())
    return path.lstat().st_size if path.exists() or path.is_symlink() else 0


# --------------------------------------------------------------------------------------------- staging (this machine)
def stage_piece(piece: str, stage: Path, data: Path | None, resume: Path | None, dry_run: bool) -> int:
    """Copy one piece's files into ``stage/<piece>`` with their checksums (from ``data``'s checksums.sha256, checked
    here too; for ``r``, computed from the files in ``resume``); files already there with the right sha256 are kept.
    Returns the piece's size in bytes."""
    if piece == RESUME:
        if resume is None:
            fail(f"piece {RESUME!r} is what a call returned: give --resume DIR (the folder of that call's files)")
        files = sorted({f for g in RESUME_FILES for f in resume.glob(g)})
        if not files:
            fail(f"--resume {resume}: none of {', '.join(RESUME_FILES)} there (the files a device call returned)")
        sources = {f.name: (f, sha256_file(f)) for f in files}
    else:
        if data is None:
            fail(f"piece {piece!r} carries data: give --data DATA (the folder with checksums.sha256)")
        if not (data / "checksums.sha256").is_file():
            fail(f"--data {data}: no checksums.sha256 there (the data root whose files it lists)")
        known = read_checksums(data / "checksums.sha256")
        missing = [n for n in PIECES[piece] if n not in known or not (data / n).is_file()]
        if missing:
            fail(f"--data {data}: {missing[0]} is missing or not in its checksums.sha256")
        sources = {n: (data / n, known[n]) for n in PIECES[piece]}
    folder = stage / piece
    size = sum(src.stat().st_size for src, _ in sources.values())
    print(f"stage/{piece}: {len(sources)} files, {size / MIB:.1f} MiB{' (dry run: nothing copied)' * dry_run}")
    if dry_run:
        return size
    if folder.exists() and piece == RESUME:  # a previous call's leftovers must not travel again
        shutil.rmtree(folder)
    for name, (src, digest) in sources.items():
        got = sha256_file(src)
        if got != digest:
            fail(f"{src}: sha256 {got} is not {digest} (its checksums.sha256): the source is damaged", code=3)
        dest = folder / name
        if not (dest.is_file() and sha256_file(dest) == digest):
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    _write_checksums(folder, {n: d for n, (_, d) in sources.items()})
    return size


def travelling(repo: Path) -> int:
    """Bytes of the working tree a call sends without its ``carry`` (tracked files present and untracked files git does
    not ignore), the :data:`AWAY` paths left out (as they are once ``away`` has run)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo, capture_output=True
    )
    if listed.returncode != 0:
        fail(f"--repo {repo}: not a git checkout ({listed.stderr.decode().strip()[:120]})")
    out = listed.stdout.decode()
    away = {p.relative_to(repo).as_posix() for p in _away_paths(repo)}
    names = {n for n in out.split("\0") if n}
    return sum(
        (repo / n).lstat().st_size
        for n in names
        if (repo / n).is_file() and not any(n == a or n.startswith(a + "/") for a in away)
    )


def stage(item: str, repo: Path, stage_dir: Path, data: Path | None, resume: Path | None, dry_run: bool) -> int:
    """Stage what ``item``'s calls carry, then print the calls (carry, command, timeout) with each one's size against
    :data:`CALL_LIMIT`; returns 1 when a call would be over it, else 0."""
    pieces = dict.fromkeys(p for carried, _, _ in CALLS[item] for p in carried)
    sizes = {p: stage_piece(p, stage_dir, data, resume, dry_run) for p in pieces}
    code = travelling(repo)
    moved = [p for p in _away_paths(repo) if p.exists()]
    print(f"the working tree without {', '.join(AWAY)}: {code / MIB:.2f} MiB")
    if moved:
        print(f"   run `python benchmarks/gpu_stage.py away` first: {len(moved)} of those paths are still in the tree")
    over = 0
    for k, (carried, command, timeout) in enumerate(CALLS[item], 1):
        total = code + sum(sizes[p] for p in carried)
        over += total > CALL_LIMIT
        where = stage_dir.relative_to(repo).as_posix() if stage_dir.is_relative_to(repo) else str(stage_dir)
        carry = json.dumps([f"{where}/{p}" for p in carried])
        flag = "ok" if total <= CALL_LIMIT else "OVER THE LIMIT"
        print(f"call {k}: {total / MIB:.2f} MiB of {CALL_LIMIT // MIB} ({flag}); carry {carry}; timeout_s {timeout}")
        print(f"   {command}")
    return 1 if over else 0


# --------------------------------------------------------------------------------------- checking (on the device)
def verify(pieces: list[str], stage_dir: Path) -> dict[str, dict[str, str]]:
    """Check every file of ``pieces`` against its piece's checksums (and that a data piece lists every file it should);
    a missing piece, file or a wrong sha256 stops here in one line (exit 3). Returns ``{piece: {file: sha256}}``."""
    found = {}
    for piece in pieces:
        sums_file = stage_dir / piece / "checksums.sha256"
        if not sums_file.is_file():
            fail(
                f"stage/{piece} is missing: the call that carries it did not run on this machine (or the machine was "
                f"given back in between); run the item's calls again from the first, one right after the other",
                code=3,
            )
        sums = read_checksums(sums_file)
        lacking = [n for n in PIECES.get(piece, ()) if n not in sums]
        if lacking:
            fail(f"stage/{piece}/checksums.sha256 does not list {lacking[0]}: stage it again", code=3)
        for name, digest in sums.items():
            path = stage_dir / piece / name
            if not path.is_file():
                fail(f"stage/{piece}/{name} is missing (listed in its checksums.sha256)", code=3)
            got = sha256_file(path)
            if got != digest:
                fail(f"stage/{piece}/{name}: sha256 {got} is not {digest}: it arrived damaged; carry it again", code=3)
        print(f"stage/{piece}: {len(sums)} files, sha256 checked ({_size(stage_dir / piece) / MIB:.1f} MiB)")
        found[piece] = sums
    return found


def data_root(datasets: list[str], stage_dir: Path) -> Path:
    """Check the pieces of ``datasets`` (:func:`verify`) and link their files into ``stage/data``, the data root the
    runs read; returns it."""
    root = stage_dir / "data"
    for ds in datasets:
        for piece, sums in verify(list(DATASETS[ds]), stage_dir).items():
            for name in sums:
                link = root / name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.unlink(missing_ok=True)
                link.symlink_to((stage_dir / piece / name).resolve())
    return root


# ------------------------------------------------------------------------------ moving what must not travel (here)
def _away_paths(repo: Path) -> list[Path]:
    manifest = _manifest(repo)
    if manifest.exists():
        return [repo / p for p in json.loads(manifest.read_text())["paths"]]
    return sorted({p for pattern in AWAY for p in repo.glob(pattern)})


def _away_dir(repo: Path) -> Path:
    return repo.parent / f"{repo.name}.away"


def _manifest(repo: Path) -> Path:
    return _away_dir(repo) / "manifest.json"


def away(repo: Path, dry_run: bool) -> None:
    """Move the :data:`AWAY` paths to ``<checkout>.away/`` beside the checkout (a manifest lists them)."""
    if _manifest(repo).exists():
        fail(f"{_away_dir(repo)} already holds moved files: run `back` first")
    paths = _away_paths(repo)
    size = sum(_size(p) for p in paths)
    print(f"away: {len(paths)} paths, {size / MIB:.1f} MiB -> {_away_dir(repo)}{' (dry run)' * dry_run}")
    if dry_run:
        return
    rel = [p.relative_to(repo).as_posix() for p in paths]
    _away_dir(repo).mkdir(parents=True, exist_ok=True)
    _manifest(repo).write_text(json.dumps({"repo": str(repo), "paths": rel}, indent=1))
    for r in rel:
        dest = _away_dir(repo) / r
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(repo / r, dest)


def back(repo: Path, dry_run: bool) -> None:
    """Move what :func:`away` moved back into the checkout; a path the checkout holds again (e.g. restored by git) is
    kept when its content is the same, and refused in one line when it differs."""
    if not _manifest(repo).exists():
        fail(f"nothing to move back: {_manifest(repo)} does not exist")
    rel = json.loads(_manifest(repo).read_text())["paths"]
    print(f"back: {len(rel)} paths <- {_away_dir(repo)}{' (dry run)' * dry_run}")
    if dry_run:
        return
    for r in rel:
        src, dest = _away_dir(repo) / r, repo / r
        if not src.exists():
            continue
        if dest.exists():
            same = dest.is_file() and src.is_file() and sha256_file(src) == sha256_file(dest)
            if not same:
                fail(f"{dest} exists and differs from the moved copy {src}: decide which to keep, then run back again")
            src.unlink()
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(src, dest)
    shutil.rmtree(_away_dir(repo))


# ------------------------------------------------------------------------------- after a call (this machine)
def _unpack(files: Path, into: Path) -> dict[str, Any]:
    """Open a call's ``meta.tar.gz`` into ``into``; returns its ``record.json``."""
    meta = files / "meta.tar.gz"
    if not meta.is_file():
        fail(f"{files}: no meta.tar.gz (the folder of the files one device call returned)")
    with tarfile.open(meta) as tar:
        tar.extractall(into, filter="data")
    return json.loads((into / "record.json").read_text())


def recheck(name: str, files: Path, meta: Path, data: Any) -> dict[str, Any]:
    """Load the returned checkpoint ``name`` (sha256, configuration and bound fields checked) and evaluate it here on
    the sets and sizes its export recorded; returns ``{"entry", "history", "counts": {split: [device, here]}}``."""
    from capsule_lib.data import DataSource
    from capsule_lib.train.recipes import recipe_config
    from capsule_lib.train.shipped import evaluation_metrics, load_pretrained, registry

    entry = registry(meta / "checkpoints")[name]
    with tempfile.TemporaryDirectory() as tmp:
        check = Path(tmp)
        shutil.copyfile(files / entry["file"], check / entry["file"])
        shutil.copyfile(meta / "checkpoints" / entry["history"], check / entry["history"])
        (check / "registry.json").write_text(json.dumps({name: entry}))
        model, _ = load_pretrained(name, directory=check)
    hist = json.loads((meta / "checkpoints" / entry["history"]).read_text())["meta"]
    source = DataSource.of(data, offline=True, standin=bool(hist.get("generated_data")))
    sets = recipe_config(hist["recipe"], hist["config"]).evaluation_sets(source)
    m = entry["metrics"]
    sets = {s: ds.subset(m[f"{s}_size"]) if m[f"{s}_size"] < len(ds) else ds for s, ds in sets.items()}
    here = evaluation_metrics(model, sets)
    counts = {s: [m[f"{s}_errors"], here[f"{s}_errors"]] for s in sets}
    return {"entry": entry, "history": meta / "checkpoints" / entry["history"], "counts": counts}


def register(name: str, checked: dict[str, Any], files: Path, target: Path, note: str, replace: bool) -> None:
    """Add a re-checked checkpoint to the registry in ``target``: its weights and history under ``name``, the entry's
    notes extended by ``note``, its ``bound_sha256`` computed again, then the whole registry checked
    (:func:`~capsule_lib.train.shipped.registry`) and the checkpoint loaded from it."""
    from capsule_lib.train.checkpoint import _atomic_write_text
    from capsule_lib.train.shipped import BOUND_FIELDS, bound_sha256, load_pretrained, registry

    reg = registry(target)
    if name in reg and not replace:
        fail(f"{target} already ships {name!r}: give --rename {name}=NEW, or --replace to ship this one instead")
    entry = dict(checked["entry"], file=f"{name}.pt", history=f"{name}.history.json")
    entry["notes"] = f"{entry.get('notes', '')} {note}".strip()
    shutil.copyfile(files / checked["entry"]["file"], target / entry["file"])
    shutil.copyfile(checked["history"], target / entry["history"])
    entry["bound_sha256"] = {f: bound_sha256(entry, f, target) for f in BOUND_FIELDS}
    reg[name] = entry
    _atomic_write_text(target / "registry.json", json.dumps(reg, indent=1, sort_keys=True))
    registry(target)
    load_pretrained(name, directory=target)


def collect(files: Path, args: argparse.Namespace) -> int:
    """Re-check, register and record one call's returned files (see the module docstring); returns the exit status."""
    from capsule_lib.cost import machine_info
    from capsule_lib.train.shipped import CHECKPOINT_DIR

    bad = next((kv for kv in args.rename if not all(kv.partition("=")[::2])), None)
    if bad is not None:
        fail(f"--rename wants OLD=NEW (a returned checkpoint's name and the name to ship it as), got {bad!r}")
    work = Path(args.scratch or tempfile.mkdtemp(prefix="gpu_collect_"))
    work.mkdir(parents=True, exist_ok=True)
    record = _unpack(files, work / "meta")
    target = Path(args.registry_dir or CHECKPOINT_DIR)
    results = Path(args.results_dir or REPO / "benchmarks" / "results")
    if args.dry_run:  # a copy of the registry: its entries and the histories they bind
        copy = work / "checkpoints"
        copy.mkdir(exist_ok=True)
        for f in [target / "registry.json", *target.glob("*.history.json")]:
            if f.is_file():
                shutil.copyfile(f, copy / f.name)
        target, results = copy, work / "results"
    renames = dict(kv.split("=", 1) for kv in args.rename)
    cpu = machine_info("cpu")["device_name"]
    checks, registered, status = {}, [], 0
    names = [r["checkpoint"] for r in record.get("runs", []) if (files / f"{r.get('checkpoint')}.pt").is_file()]
    for name in names:
        try:
            checked = recheck(name, files, work / "meta", args.data_root)
        except (OSError, ValueError, KeyError) as e:  # no data here, a damaged file: one line, nothing registered
            fail(f"{name}: cannot be re-checked here: {str(e).splitlines()[0] if str(e) else type(e).__name__}", 1)
        counts = checked["counts"]
        off = max(abs(a - b) for a, b in counts.values())
        checks[name] = counts
        print(f"{name}: errors (device, here) " + ", ".join(f"{s} {a}/{b}" for s, (a, b) in counts.items()))
        if off > args.tolerance:
            print(f"{name}: not registered: the counts differ by {off} (--tolerance {args.tolerance})")
            status = 1
            continue
        agree = "equal" if off == 0 else f"are within {off} of"
        note = f"Re-checked on {cpu}: the {', '.join(counts)} error counts {agree} the device's."
        register(renames.get(name, name), checked, files, target, note, args.replace)
        registered.append(renames.get(name, name))
    slug = re.sub(r"[^a-z0-9]+", "_", record["machine"]["device_name"].lower()).strip("_")
    out = results / f"gpu_{record['item']}_{slug}.json"
    rows = json.loads(out.read_text()) if out.is_file() else {"what": f"benchmarks/gpu_items.py {record['item']}"}
    speedrun = work / "meta" / "speedrun.json"
    rows.setdefault("calls", []).append(
        {
            "record": record,
            "speedrun": json.loads(speedrun.read_text()) if speedrun.is_file() else None,
            "recheck": {"machine": cpu, "errors_device_here": checks},
            "registered": registered,
        }
    )
    results.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"recorded {out}; registered {registered or 'nothing'} in {target}{' (dry run: a copy)' * args.dry_run}")
    keep = work
    if not args.dry_run:  # the returned files kept (the device's folder goes with the session): --resume reads them
        keep = REPO / "runs" / "gpu" / f"{record['item']}_{datetime.datetime.now():%Y%m%d_%H%M%S}"
        shutil.copytree(files, keep / "files")
        shutil.copytree(work / "meta", keep / "meta")
        print(f"the call's files: {keep / 'files'} (stage ... --resume {keep / 'files'} sends its state out again)")
    if record["item"] == "critique":
        print(
            f"the runs' results: python benchmarks/critique_runs.py --collect --runs-dir {keep / 'meta' / 'critique'} "
            f"--records benchmarks/results/critique_runs_converged.json"
        )
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage-dir", type=Path, default=REPO / "stage", help="where the pieces go (git-ignored)")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose calls these are (default: this one)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stage", help="stage an item's pieces and print its calls with their sizes")
    s.add_argument("item", choices=sorted(CALLS))
    s.add_argument("--data", type=Path, default=os.environ.get("CAPSULE_DATA"), help="data root (checksums.sha256)")
    s.add_argument("--resume", type=Path, default=None, help="the files a call returned that go out again (piece r)")
    v = sub.add_parser("verify", help="(on the device) check staged pieces against their sha256")
    v.add_argument("pieces", nargs="+", choices=sorted([*PIECES, RESUME]))
    sub.add_parser("away", help="move the tracked checkpoints out of the checkout")
    sub.add_parser("back", help="move them back")
    c = sub.add_parser("collect", help="re-check, register and record the files one call returned")
    c.add_argument("files", type=Path, help="the folder of the files one call returned")
    c.add_argument("--data-root", default=os.environ.get("CAPSULE_DATA"), help="where the re-check reads the data")
    c.add_argument("--registry-dir", default=None, help="register there (default: capsule_lib/checkpoints)")
    c.add_argument("--results-dir", default=None, help="record there (default: benchmarks/results)")
    c.add_argument("--rename", action="append", default=[], metavar="OLD=NEW", help="register OLD as NEW")
    c.add_argument("--replace", action="store_true", help="replace a shipped checkpoint of the same name")
    c.add_argument("--tolerance", type=int, default=0, help="error counts may differ by this much (default 0)")
    c.add_argument("--scratch", type=Path, default=None, help="where the call's files are opened (default: a new temp)")
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    if a.command == "stage":
        return stage(a.item, repo, a.stage_dir.resolve(), a.data, a.resume, a.dry_run)
    if a.command == "verify":
        verify(a.pieces, a.stage_dir)
    elif a.command == "away":
        away(repo, a.dry_run)
    elif a.command == "back":
        back(repo, a.dry_run)
    else:
        return collect(a.files, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
