"""`pearl profile DIR --hardware H800 --tp 2` (issue 36): the planner's prior for a model directory, derived from
its config.json, printed locally; a directory that could not be a job's model says why; a bad path is exit 2."""

from __future__ import annotations

import json

import pytest

from controlplane.core.profiles import get_profile
from pearl_cli.main import main
from tests.support.hf_models import model_dir
from tests.unit.core.test_model_dir import QWEN3_8B


def test_profile_prints_the_derived_prior_of_a_config(tmp_path, capsys):
    (tmp_path / "q8").mkdir()
    (tmp_path / "q8" / "config.json").write_text(json.dumps(QWEN3_8B))
    assert main(["profile", str(tmp_path / "q8"), "--hardware", "H800", "--tp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = get_profile("H800", "qwen3-8b", 2)
    assert (out["hardware"], out["tp"], out["layers"], out["kv_heads"]) == ("H800", 2, 36, 8)
    assert out["decode_a_s"] == pytest.approx(ref.decode_a, rel=1e-3)
    assert out["kv_bytes_per_token"] == ref.kv_bytes_per_token
    assert "has no weights" in out["refused"]  # a config alone is not a model directory
    assert main(["profile", str(tmp_path / "q8"), "--hardware", "H800", "--tp", "2"]) == 0
    text = capsys.readouterr().out
    assert "on 2xH800" in text and "36 layers" in text and "A = 4.83" in text


def test_a_usable_directory_has_no_note_and_a_bad_path_is_exit_2(tmp_path, capsys):
    path = model_dir(tmp_path, "mistral")
    assert main(["profile", str(path), "--hardware", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "2 layers, hidden 64" in text and "refused" not in text
    assert main(["profile", str(tmp_path / "nothing")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["profile", str(path), "--hardware", "B200"]) == 2
    assert "unknown hardware" in capsys.readouterr().err
