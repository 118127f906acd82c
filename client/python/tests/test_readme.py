"""The Python examples of client/python/README.md and of
docs/clients/migrating.md's "Coming from RedisFairLock" run as written,
each in a fresh process, against the suite's cluster (its addresses put in
place of the READMEs' 127.0.0.1:7101-7103)."""

import re
import subprocess
import sys

import pytest

from conftest import REPO

README_ENDPOINTS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"


def blocks(path, section=None):
    text = (REPO / path).read_text()
    if section is not None:
        start = text.index(section)
        end = text.find("\n## ", start + 1)
        nxt = text.find("\n### ", start + 1)
        end = min(e for e in (end, nxt, len(text)) if e != -1)
        text = text[start:end]
    found = re.findall(r"```python\n(.*?)```", text, re.S)
    return [b for b in found if "import raftlock" in b]


EXAMPLES = [("client/python/README.md", None, i, b) for i, b in enumerate(blocks("client/python/README.md"))] + [
    ("docs/clients/migrating.md", "## Coming from RedisFairLock", i, b)
    for i, b in enumerate(blocks("docs/clients/migrating.md", "## Coming from RedisFairLock"))
]


def test_the_readmes_have_runnable_examples():
    assert len([e for e in EXAMPLES if e[0] == "client/python/README.md"]) >= 4
    assert len([e for e in EXAMPLES if e[0] == "docs/clients/migrating.md"]) == 1
    first = blocks("client/python/README.md")[0]
    # Install and a first lock in under ten lines.
    assert len([line for line in first.splitlines() if line.strip()]) + 1 < 10


@pytest.mark.parametrize("path,section,index,code", EXAMPLES, ids=[f"{e[0]}#{e[2]}" for e in EXAMPLES])
def test_readme_example_runs(cluster, path, section, index, code):
    assert README_ENDPOINTS in code, "the example names the dev cluster's addresses"
    code = code.replace(README_ENDPOINTS, cluster.endpoints)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fence" in out.stdout or out.stdout.strip(), out.stdout
