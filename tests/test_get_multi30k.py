"""scripts/get_multi30k.py: downloads from a real HTTP server (on 127.0.0.1, serving fixture files), checks
every file, keeps no wrong or partial file, and records the checksums of the real Multi30k files."""

import gzip
import hashlib
import http.server
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import get_multi30k  # noqa: E402

SHARED_MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
LINES = {"train": ["Zwei Männer stehen am Herd.", "Ein Hund läuft."], "val": ["Ein Kind spielt."]}


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/served, counting the requests it answers."""
    served = tmp_path / "served"
    served.mkdir()
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):  # quiet
            requests.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}/", requests
    httpd.shutdown()
    httpd.server_close()


def serve(folder: Path, name: str, text: str) -> tuple[int, str]:
    data = text.encode()
    (folder / f"{name}.gz").write_bytes(gzip.compress(data))
    return data.count(b"\n"), hashlib.sha256(data).hexdigest()


def test_downloads_gunzips_and_checks_every_file_then_keeps_them(server, tmp_path):
    served, url, requests = server
    files = {f"{split}.de": serve(served, f"{split}.de", "\n".join(lines) + "\n") for split, lines in LINES.items()}
    out = tmp_path / "multi30k"
    paths = get_multi30k.download(out, url, files)
    assert [p.name for p in paths] == ["train.de", "val.de"]
    assert (out / "train.de").read_text().splitlines() == LINES["train"]
    assert sorted(p.name for p in out.iterdir()) == ["train.de", "val.de"]  # nothing else left behind
    assert len(requests) == 2
    get_multi30k.download(out, url, files)  # present and verified: not fetched again
    assert len(requests) == 2


def test_a_file_that_is_not_the_recorded_one_is_not_kept(server, tmp_path):
    served, url, _ = server
    files = {"train.de": serve(served, "train.de", "Zwei Männer stehen am Herd.\n")}
    serve(served, "train.de", "Zwei Männer stehen am Herd!\n")  # the server now has other content
    out = tmp_path / "multi30k"
    with pytest.raises(
        get_multi30k.DownloadError, match=r"train\.de\.gz: the file is not the recorded one .*It was not kept"
    ):
        get_multi30k.download(out, url, files)
    assert list(out.iterdir()) == []


def test_missing_file_and_command_line_errors_name_the_file_without_a_traceback(server, tmp_path, capsys):
    served, url, _ = server
    out = tmp_path / "multi30k"
    assert get_multi30k.main(["--output-dir", str(out), "--base-url", url]) == 1  # the server has none of the files
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "train.en.gz: could not be downloaded" in err and "Traceback" not in err
    assert list(out.iterdir()) == []
    (served / "train.en.gz").write_bytes(b"not gzip")
    with pytest.raises(get_multi30k.DownloadError, match="could not be downloaded"):
        get_multi30k.download(out, url, {"train.en": (1, "0" * 64)})
    assert list(out.iterdir()) == []


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(), reason="the Multi30k copy beside the repository is not here")
def test_recorded_checksums_are_those_of_the_real_files(server, tmp_path):
    served, url, _ = server
    for name, (lines, checksum) in get_multi30k.FILES.items():
        data = (SHARED_MULTI30K / name).read_bytes()
        assert (data.count(b"\n"), hashlib.sha256(data).hexdigest()) == (lines, checksum), name
        (served / f"{name}.gz").write_bytes(gzip.compress(data))
    out = tmp_path / "multi30k"
    assert get_multi30k.main(["--output-dir", str(out), "--base-url", url]) == 0
    assert all((out / name).read_bytes() == (SHARED_MULTI30K / name).read_bytes() for name in get_multi30k.FILES)
