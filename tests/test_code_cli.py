"""Which folder `gpuopt jobs submit` ships, and the workdir the submitted spec then holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli.code import ShipError, Shipping, shipping


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "specs").mkdir()
    (tmp_path / "proj" / "sub" / "deep").mkdir(parents=True)
    return tmp_path


def test_a_local_workdir_relative_to_the_spec_is_shipped_whole(tree: Path) -> None:
    found = shipping("../proj/sub", tree / "specs", None)
    assert found == Shipping(tree / "specs" / "../proj/sub", None)
    assert found is not None and found.root.resolve() == (tree / "proj" / "sub").resolve()


def test_an_absolute_local_workdir_is_shipped(tree: Path) -> None:
    assert shipping(str(tree / "proj"), tree / "specs", None) == Shipping(tree / "proj", None)


def test_a_workdir_that_is_no_local_folder_ships_nothing(tree: Path) -> None:
    assert shipping("/srv/train", tree / "specs", None) is None
    assert shipping("not-here", tree / "specs", None) is None
    assert shipping(None, tree / "specs", None) is None


def test_code_dir_an_ancestor_of_the_workdir_gives_the_sub_folder(tree: Path) -> None:
    code = tree / "proj"
    assert shipping(str(code / "sub" / "deep"), tree / "specs", code) == Shipping(code, "sub/deep")
    assert shipping("../proj/sub", tree / "specs", code) == Shipping(code, "sub")
    assert shipping(str(code), tree / "specs", code) == Shipping(code, None)
    assert shipping(None, tree / "specs", code) == Shipping(code, None)


def test_code_dir_with_a_workdir_named_inside_the_archive(tree: Path) -> None:
    # `sub` is no folder beside the spec, but is one in the folder shipped
    assert shipping("sub", tree / "specs", tree / "proj") == Shipping(tree / "proj", "sub")


def test_code_dir_with_a_workdir_elsewhere_is_refused(tree: Path) -> None:
    with pytest.raises(ShipError, match="is neither inside --code"):
        shipping(str(tree / "specs"), tree / "specs", tree / "proj")
    with pytest.raises(ShipError, match="not a folder"):
        shipping(None, tree / "specs", tree / "missing")


def test_submit_refuses_a_code_folder_that_is_not_there_in_one_line(tree: Path) -> None:
    from tests.helpers.daemon import run_gpuopt

    spec = tree / "specs" / "job.yaml"
    spec.write_text("name: a\npolicy: p\nrun: python train.py\ncheckpoint_dir: /ckpt\n")
    done = run_gpuopt(
        tree / "data",
        *("jobs", "submit", str(spec), "--code", str(tree / "missing")),
        env={"GPUOPT_API_URL": "http://127.0.0.1:9", "GPUOPT_API_TOKEN": "t"},
    )
    assert done.returncode == 2
    assert done.stderr == f"gpuopt: error: --code {tree / 'missing'}: not a folder\n"
