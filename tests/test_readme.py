"""The README's Python quickstart runs exactly as written, and its shape comments are true.

A statement commented `# [2, 10]` must leave a tensor of that shape in the name it assigns (the last name of a
tuple target); `# 12 x [2, 3, 197, 197]` means a list/tuple of 12 such tensors."""
import ast
import io
import re
import tokenize
from pathlib import Path

import torch

SHAPE = re.compile(r"(?:(\d+) x )?\[(\d+(?:, \d+)*)\]")


def _shape_comments(code: str) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """line number -> (count or None, shape) for every comment that states a shape."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT and (m := SHAPE.search(tok.string)):
            found[tok.start[0]] = (int(m[1]) if m[1] else None, tuple(int(d) for d in m[2].split(", ")))
    return found


def _assigned_name(stmt: ast.stmt) -> str:
    assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, ast.unparse(stmt)
    target = stmt.targets[0]
    if isinstance(target, ast.Tuple):
        target = target.elts[-1]
    assert isinstance(target, ast.Name), ast.unparse(stmt)
    return target.id


def run_and_check_shapes(code: str) -> tuple[dict, int]:
    """Execute `code` one top-level statement at a time; after each statement carrying a shape comment, check
    the value it assigned. Returns the namespace and how many comments were checked."""
    comments, ns, checked = _shape_comments(code), {}, 0
    for stmt in ast.parse(code).body:
        exec(compile(ast.Module([stmt], type_ignores=[]), "README.md", "exec"), ns)
        for line in range(stmt.lineno, stmt.end_lineno + 1):
            if line not in comments:
                continue
            count, shape = comments[line]
            name = _assigned_name(stmt)
            value = ns[name]
            items = value if count is not None else [value]
            if count is not None:
                assert isinstance(value, (list, tuple)) and len(value) == count, f"README.md:{line} {name}: {count} x"
            for item in items:
                assert isinstance(item, torch.Tensor) and tuple(item.shape) == shape, (
                    f"README.md:{line}: {name} is {getattr(item, 'shape', type(item))}, the comment says {shape}")
            checked += 1
    return ns, checked


def test_shape_comment_checker_catches_a_wrong_comment():
    code = "import torch\nx = torch.zeros(2, 3)  # [2, 3]\ny = [x, x]  # 2 x [2, 3]\n"
    assert run_and_check_shapes(code)[1] == 2
    for wrong in ("x = torch.zeros(2, 3)  # [3, 2]\n", "y = [torch.zeros(1)]  # 2 x [1]\n"):
        try:
            run_and_check_shapes("import torch\n" + wrong)
        except AssertionError:
            continue
        raise AssertionError(f"not caught: {wrong!r}")


def test_readme_quickstart_runs(tmp_path, monkeypatch):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, "README has no python block"
    monkeypatch.chdir(tmp_path)
    total_comments = total_checked = 0
    for code in blocks:
        ns, checked = run_and_check_shapes(code)
        total_comments += len(_shape_comments(code))
        total_checked += checked
        if "tokens" in ns and "model" in ns:  # "any size divisible by the patch": 160x320 -> a 10 x 20 grid
            n_prefix = ns["model"].num_prefix_tokens
            assert tuple(ns["tokens"].shape) == (1, n_prefix + 10 * 20, ns["model"].embed_dim)
    assert total_checked == total_comments >= 4  # every shape comment in the quickstart was checked
