"""Method tests use the trainer tests' tiny checkpoints and helpers (``tiny_dirs``, ``th``): one definition, in
tests/trainer/conftest.py, loaded here by path (test folders are not packages)."""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_trainer_conftest",
                                               pathlib.Path(__file__).parents[1] / "trainer" / "conftest.py")
_trainer_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_trainer_conftest)

tiny_dirs, th = _trainer_conftest.tiny_dirs, _trainer_conftest.th
