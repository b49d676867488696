"""The committed stubs in ddtree/v1/ are exactly what grpc_tools.protoc generates from
protos/ddtree/v1/*.proto (regenerate with scripts/gen_protos.sh)."""

from __future__ import annotations

from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(REPO / "protos")) for p in (REPO / "protos").rglob("*.proto"))
    args = [
        "protoc",
        f"-I{REPO / 'protos'}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        *protos,
    ]
    assert protoc.main(args) == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc generated nothing"
    stale = [
        str(rel)
        for rel in generated
        if not (REPO / rel).is_file() or (REPO / rel).read_bytes() != (tmp_path / rel).read_bytes()
    ]
    assert not stale, f"stale generated stubs (run scripts/gen_protos.sh): {stale}"
