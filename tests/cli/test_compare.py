"""attnlab compare vit-cnn."""


def test_compare_vit_cnn_writes_records_and_a_chart(tmp_path):
    import json

    from typer.testing import CliRunner

    from attnlab.cli import app

    res = CliRunner().invoke(app, ["compare", "vit-cnn", "--fractions", "0.1", "--models", "cnn", "--seeds", "0", "--steps", "20",
                                   "-o", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    recs = json.loads((tmp_path / "c.json").read_text())["records"]
    assert [r["model"] for r in recs] == ["cnn"] and recs[0]["fraction"] == 0.1
    assert (tmp_path / "c.png").stat().st_size > 5000
    bad = CliRunner().invoke(app, ["compare", "vit-cnn", "--models", "transformer", "--seeds", "0"])
    assert bad.exit_code == 2 and "does not read images" in " ".join(bad.output.split())
