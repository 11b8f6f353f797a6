"""Download Multi30k task 1 (English–German: train, val, test_2016_flickr) into the layout that
``benchmarks/multi30k.py`` reads, and check every file against its recorded SHA-256.

    python scripts/get_multi30k.py                    # into data/multi30k (what the benchmarks read first)
    python scripts/get_multi30k.py --output-dir DIR   # elsewhere; then give the benchmarks --data DIR

The files come from the official repository, https://github.com/multi30k/dataset, at a fixed commit
(``data/task1/raw/<split>.<lang>.gz``), and are written gunzipped as ``<split>.<lang>``. A file whose
checksum differs is not kept: the script stops, names it, and gives both checksums. Files already present
with the right checksum are not downloaded again.

Terms: the repository has no licence file; its README restricts the data to non-commercial research and
education and asks users to cite Elliott et al. (2016), "Multi30K: Multilingual English-German Image
Descriptions" (doi:10.18653/v1/W16-3210).

Written with the standard library alone (urllib, gzip, hashlib): ``datasets``' download manager would also
do, but it caches in its own folder and its checksum checks do not name the file to fix.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
BASE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{COMMIT}/data/task1/raw/"
#: The gunzipped files: name -> (lines, SHA-256), as recorded from the repository at COMMIT.
FILES = {
    "train.en": (29000, "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
    "train.de": (29000, "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
    "val.en": (1014, "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
    "val.de": (1014, "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
    "test_2016_flickr.en": (1000, "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"),
    "test_2016_flickr.de": (1000, "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16"),
}


class DownloadError(RuntimeError):
    """A file that could not be fetched, or whose content is not the recorded one."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(
    output_dir: str | Path = ROOT / "data" / "multi30k",
    base_url: str = BASE_URL,
    files: dict[str, tuple[int, str]] = FILES,
    timeout: float = 60.0,
) -> list[Path]:
    """Fetch ``<base_url><name>.gz`` for each of ``files``, gunzip it into ``output_dir/<name>`` and check
    its line count and SHA-256. Returns the paths, in ``files``' order. A file is written under a temporary
    name and renamed only once checked, so a failed or interrupted run never leaves a wrong file behind."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (lines, checksum) in files.items():
        path = output_dir / name
        paths.append(path)
        if path.is_file() and sha256(path) == checksum:
            print(f"{path}: present, checksum verified")
            continue
        url = f"{base_url}{name}.gz"
        with tempfile.NamedTemporaryFile(dir=output_dir, prefix=f".{name}.", delete=False) as partial:
            partial_path = Path(partial.name)
            try:
                with (
                    urllib.request.urlopen(url, timeout=timeout) as response,
                    gzip.GzipFile(fileobj=response) as unzipped,
                ):
                    shutil.copyfileobj(unzipped, partial)
            except (urllib.error.URLError, OSError, EOFError) as error:  # HTTP errors, no network, a broken gzip
                partial.close()
                partial_path.unlink()
                raise DownloadError(
                    f"{url}: could not be downloaded ({error}). Check the network, or download it by "
                    f"hand, gunzip it and place it at {path}."
                ) from None
        got = sha256(partial_path)
        got_lines = partial_path.read_bytes().count(b"\n")
        if got != checksum or got_lines != lines:
            partial_path.unlink()
            raise DownloadError(
                f"{url}: the file is not the recorded one ({got_lines:,} lines, sha256 {got}; expected "
                f"{lines:,} lines, sha256 {checksum}). It was not kept. If the repository changed, "
                f"its commit {COMMIT} still holds the recorded files."
            )
        partial_path.replace(path)
        print(f"{path}: {lines:,} lines, checksum verified")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "multi30k")
    parser.add_argument(
        "--base-url", default=BASE_URL, help="where <split>.<lang>.gz are (default: the official repository)"
    )
    args = parser.parse_args(argv)
    try:
        download(args.output_dir, args.base_url)
    except DownloadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Multi30k is in {args.output_dir}: python benchmarks/multi30k.py reads it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
