"""docs/ARCHITECTURE.md maps every module: a newcomer finds each file there."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine_lite", "loadgen", "slo", "tuner", "benchmarks")


def test_every_module_is_named_in_the_architecture_map():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            inside = path.relative_to(ROOT / package).as_posix()
            if f"`{inside}`" not in doc and f"`{path.name}`" not in doc:
                missing.append(f"{package}/{inside}")
    assert not missing, f"add these to docs/ARCHITECTURE.md: {missing}"
