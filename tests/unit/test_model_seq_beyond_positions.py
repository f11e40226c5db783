"""A Hugging Face model trained at a sequence longer than its max_position_embeddings is
priced as asked, with a warning that says so (Qwen3-32B, 40,960 positions, planned at
131,072 tokens said nothing)."""

from paraplan.predict.models import load_model


def test_a_length_beyond_the_positions_is_named(capsys, repo_root):
    path = repo_root / "tests/data/hf/qwen3-32b.json"
    assert load_model(str(path), seq_length=131072, prog="paraplan plan").seq_length == 131072
    assert capsys.readouterr().err == (
        f"paraplan plan: warning: {path}: sequence length 131,072 is beyond the model's max_position_embeddings "
        "40,960; priced as asked (the positions' extension, e.g. YaRN or a rope_scaling change, costs nothing "
        "paraplan counts)\n")


def test_a_length_within_the_positions_says_nothing(capsys, repo_root):
    load_model(str(repo_root / "tests/data/hf/qwen3-32b.json"), seq_length=40960)
    assert capsys.readouterr().err == ""
