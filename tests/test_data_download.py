"""data_scripts/_download.py and the dataset scripts, against a local HTTP server on 127.0.0.1 serving
fabricated bytes (with and without Range support) and a fake opener for the unreachable-host case. No
traffic to any other host."""

import hashlib
import importlib.util
import io
import socket
import sys
import tarfile
import threading
import urllib.error
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "data_scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(f"data_scripts_{name}", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPTS))
    return mod


D = load("_download")
PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


class Server:
    """Serves ``files`` ({path: bytes}); records requests; optional Range support and truncation."""

    def __init__(self, files, ranges=True, cut_after=None):
        self.files, self.ranges, self.cut_after = files, ranges, cut_after
        self.requests: list[tuple[str, str | None]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.requests.append((self.path, rng))
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and outer.ranges:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                chunk = body[start:]
                self.send_header("Content-Length", str(len(chunk)))
                self.end_headers()
                if outer.cut_after is not None:
                    self.wfile.write(chunk[: outer.cut_after])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(chunk)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.httpd.shutdown()
        self.httpd.server_close()


def res(url, **kw):
    return D.Resource((url,), "file.bin", **kw)


def no_network(*a, **k):
    raise AssertionError("the network must not be used")


def test_fresh_download_is_verified_and_atomic(tmp_path):
    with Server({"/f": PAYLOAD}) as s:
        out = D.fetch(res(s.url + "/f", sha256=SHA, size=len(PAYLOAD)), tmp_path, log=lambda m: None)
    assert out.read_bytes() == PAYLOAD and sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]
    assert s.requests == [("/f", None)]


def test_resume_from_a_partial_file(tmp_path):
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD[:30000])
    logs = []
    with Server({"/f": PAYLOAD}) as s:
        D.fetch(res(s.url + "/f", md5=MD5), tmp_path, log=logs.append)
    assert s.requests == [("/f", "bytes=30000-")]  # only the rest was asked for
    assert (tmp_path / "file.bin").read_bytes() == PAYLOAD and not (tmp_path / "file.bin.part").exists()
    assert any("resumed at byte 30000" in m for m in logs)


def test_server_without_range_support_restarts(tmp_path):
    (tmp_path / "file.bin.part").write_bytes(b"junk" * 100)
    logs = []
    with Server({"/f": PAYLOAD}, ranges=False) as s:
        D.fetch(res(s.url + "/f", sha256=SHA), tmp_path, log=logs.append)
    assert (tmp_path / "file.bin").read_bytes() == PAYLOAD
    assert any("starting over" in m for m in logs)


def test_interrupted_transfer_keeps_the_part_and_the_next_run_resumes(tmp_path):
    with Server({"/f": PAYLOAD}, cut_after=40000) as s:
        r = res(s.url + "/f", sha256=SHA, size=len(PAYLOAD))
        with pytest.raises(D.DownloadError, match="run again to resume"):
            D.fetch(r, tmp_path, log=lambda m: None)
    part = tmp_path / "file.bin.part"
    assert part.exists() and 0 < part.stat().st_size < len(PAYLOAD) and not (tmp_path / "file.bin").exists()
    have = part.stat().st_size
    with Server({"/f": PAYLOAD}) as s2:
        r2 = D.Resource((s2.url + "/f",), "file.bin", sha256=SHA, size=len(PAYLOAD))
        D.fetch(r2, tmp_path, log=lambda m: None)
    assert s2.requests == [("/f", f"bytes={have}-")] and (tmp_path / "file.bin").read_bytes() == PAYLOAD


def test_checksum_mismatch_names_file_and_both_hashes_and_deletes_nothing_else(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "other.bin").write_bytes(b"previously verified")
    wrong = "0" * 64
    with Server({"/f": PAYLOAD}) as s:
        with pytest.raises(D.ChecksumError) as e:
            D.fetch(res(s.url + "/f", sha256=wrong), tmp_path, log=lambda m: None)
    msg = str(e.value)
    assert "file.bin" in msg and wrong in msg and SHA in msg and "nothing else was deleted" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "other.bin"]  # only the .part went
    # a present file with the wrong content is refused and left alone
    (tmp_path / "file.bin").write_bytes(b"tampered")
    with pytest.raises(D.ChecksumError) as e2:
        D.fetch(res("http://127.0.0.1:9/never", md5=MD5), tmp_path, opener=no_network, log=lambda m: None)
    assert MD5 in str(e2.value) and hashlib.md5(b"tampered").hexdigest() in str(e2.value)
    assert (tmp_path / "file.bin").read_bytes() == b"tampered"


def test_second_run_does_nothing(tmp_path):
    with Server({"/f": PAYLOAD}) as s:
        D.fetch(res(s.url + "/f", sha256=SHA), tmp_path, log=lambda m: None)
    f = tmp_path / "file.bin"
    mtime = f.stat().st_mtime_ns
    logs = []
    D.fetch(res("http://127.0.0.1:9/never", sha256=SHA), tmp_path, opener=no_network, log=logs.append)
    assert f.stat().st_mtime_ns == mtime and logs == ["file.bin: already present, verified"]


def test_unreachable_host_gives_one_line(tmp_path, capsys):
    def unreachable(req, timeout=None):
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    r = D.Resource(("https://data.example.org/x/file.bin",), "file.bin", sha256=SHA)
    with pytest.raises(D.OfflineError) as e:
        D.fetch(r, tmp_path / "ds", opener=unreachable, log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg and "data.example.org" in msg and "unreachable" in msg
    assert "https://data.example.org/x/file.bin" in msg and "CAPSULE_OFFLINE=1" in msg
    assert not (tmp_path / "ds").exists()  # nothing created
    ds = D.Dataset("Demo", "demo", [r])
    assert D.main(ds, ["--root", str(tmp_path)], opener=unreachable) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("offline: host data.example.org is unreachable")


def test_mirrors_are_tried_in_order(tmp_path):
    calls = []

    def opener(req, timeout=None):
        calls.append(req.full_url)
        if "dead" in req.full_url:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        return urllib.request.urlopen(req, timeout=timeout)

    import urllib.request

    with Server({"/f": PAYLOAD}) as s:
        r = D.Resource(("http://dead.invalid/f", s.url + "/f"), "file.bin", md5=MD5)
        D.fetch(r, tmp_path, opener=opener, log=lambda m: None)
    assert calls[0] == "http://dead.invalid/f" and (tmp_path / "file.bin").read_bytes() == PAYLOAD


def test_unknown_checksum_prints_sha256_and_list_says_unverified(tmp_path, capsys):
    logs = []
    with Server({"/f": PAYLOAD}) as s:
        r = D.Resource((s.url + "/f",), "file.bin")
        D.fetch(r, tmp_path / "demo", log=logs.append)
    assert any("could not verify" in m and SHA in m for m in logs)
    ds = D.Dataset(
        "Demo",
        "demo",
        [
            r,
            D.Resource(("http://x/y",), "missing.bin", sha256=SHA),
            D.Resource(("http://x/z",), "half.bin", sha256=SHA),
            D.Resource(("http://x/w",), "good.bin", sha256=SHA, checksum_source="a test"),
            D.Resource(("http://x/v",), "bad.bin", sha256=SHA),
        ],
    )
    (tmp_path / "demo" / "half.bin.part").write_bytes(b"12345")
    (tmp_path / "demo" / "good.bin").write_bytes(PAYLOAD)
    (tmp_path / "demo" / "bad.bin").write_bytes(b"x")
    assert D.main(ds, ["--root", str(tmp_path), "--list"], opener=no_network) == 0
    out = capsys.readouterr().out
    assert f"file.bin: present, unverified (no published checksum; sha256 {SHA})" in out
    assert "missing.bin: missing" in out and "half.bin: partial download (5 bytes" in out
    assert "good.bin: present, verified (sha256 matches a test)" in out
    assert "bad.bin: present, CHECKSUM MISMATCH" in out and SHA in out


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_run_fetches_and_extracts_atomically_then_is_idempotent(tmp_path, capsys):
    tgz = _tar_gz({"pkg/a.txt": b"A", "pkg/sub/b.txt": b"B", "other/c.txt": b"C"})
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as z:
        z.writestr("test.mat", b"MAT")
    zb = zbuf.getvalue()
    with Server({"/p.tar.gz": tgz, "/t.zip": zb}) as s:
        ds = D.Dataset(
            "Demo",
            "demo",
            [
                D.Resource((s.url + "/p.tar.gz",), "p.tar.gz", md5=hashlib.md5(tgz).hexdigest()),
                D.Resource((s.url + "/t.zip",), "t.zip", sha256=hashlib.sha256(zb).hexdigest()),
            ],
            extractions={"p.tar.gz": ("pkg", "pkg"), "t.zip": ("test.mat", "renamed.mat")},
        )
        assert D.main(ds, ["--root", str(tmp_path)]) == 0
        n = len(s.requests)
        assert D.main(ds, ["--root", str(tmp_path)]) == 0
        assert len(s.requests) == n  # the second run opened no connection
    folder = tmp_path / "demo"
    assert (folder / "pkg" / "sub" / "b.txt").read_bytes() == b"B" and not (folder / "other").exists()
    assert (folder / "renamed.mat").read_bytes() == b"MAT"
    assert not any(p.name.startswith(".") for p in folder.iterdir())  # no temporary folders left
    out = capsys.readouterr().out
    assert "already extracted" in out and "already present, verified" in out
    # the archive may be deleted after extraction: the next run still does nothing
    (folder / "p.tar.gz").unlink()
    assert D.main(ds, ["--root", str(tmp_path)], opener=no_network) == 0


def test_unsafe_archive_members_are_refused(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_tar_gz({"pkg/../../evil.txt": b"x"}))
    with pytest.raises(D.DownloadError, match="unsafe path"):
        D.extract_archive(bad, "pkg", tmp_path / "out", log=lambda m: None)
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "evil.txt").exists()


def test_dataset_scripts_use_published_checksums():
    tv = pytest.importorskip("torchvision.datasets")
    mnist, fashion = load("mnist"), load("fashion_mnist")
    assert {r.filename: r.md5 for r in mnist.DATASET.resources} == dict(tv.MNIST.resources)
    assert {r.filename: r.md5 for r in fashion.DATASET.resources} == dict(tv.FashionMNIST.resources)
    assert [r.urls[0].rsplit("/", 1)[0] + "/" for r in mnist.DATASET.resources][0] == tv.MNIST.mirrors[0]
    c10, c100 = load("cifar10").DATASET.resources[0], load("cifar100").DATASET.resources[0]
    assert (c10.url, c10.md5) == (tv.CIFAR10.url, tv.CIFAR10.tgz_md5)
    assert (c100.url, c100.md5) == (tv.CIFAR100.url, tv.CIFAR100.tgz_md5)
    norb = load("smallnorb").DATASET
    assert len(norb.resources) == 6 and all(r.sha256 and len(r.sha256) == 64 and r.size for r in norb.resources)
    assert {r.filename.split("-")[-1] for r in norb.resources} == {"dat.mat.gz", "cat.mat.gz", "info.mat.gz"}
    aff = load("affnist").DATASET
    assert aff.resources[0].sha256 and aff.extractions == {"test.mat.zip": ("test.mat", "affNIST_test.mat")}
    assert load("sst").DATASET.resources[0].filename == "trainDevTestTrees_PTB.zip"


def test_scripts_list_without_network(tmp_path):
    import subprocess

    for name in ("mnist", "fashion_mnist", "cifar10", "cifar100", "smallnorb", "affnist", "sst", "heinsen_weights"):
        r = subprocess.run(
            [sys.executable, str(SCRIPTS / f"{name}.py"), "--root", str(tmp_path), "--list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "missing" in r.stdout, (name, r.stdout, r.stderr)
    assert list(tmp_path.iterdir()) == []  # --list writes nothing
