"""compile_definitions: classes and methods out of a pinned file, clear errors otherwise."""

import pytest

from course.runtime.pinned import compile_definitions

SOURCE = '''
import torch  # never executed: only the named definitions are compiled

class Mode:
    A = 1

class Config:
    def double(self, x):
        return 2 * x + OFFSET
'''


def test_compiles_a_class_and_a_method_into_the_namespace(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(SOURCE)
    env = {"OFFSET": 1}
    mode, double = compile_definitions("pkg/m.py", ["Mode", "Config.double"], env, root=tmp_path)
    assert mode.A == 1 and double(None, 3) == 7, "the method must run as a plain function in env"
    assert "torch" not in env, "only the named definitions are compiled, not the file's imports"


def test_missing_definitions_are_clear_errors(tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    with pytest.raises(LookupError, match="no top-level definition 'Nope'"):
        compile_definitions("m.py", ["Nope"], {}, root=tmp_path)
    with pytest.raises(LookupError, match="Config has no method 'triple'"):
        compile_definitions("m.py", ["Config.triple"], {}, root=tmp_path)
