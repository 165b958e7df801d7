"""reward.weights imports and calls 'package.module:factory' names (the plugin mechanism): the help says so."""
import contextlib
import io

from flow_grpo.cli import main


def test_train_help_states_the_trust_model():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main(["train", "--help"])
    text = " ".join(buf.getvalue().split())  # help text is wrapped
    weights_help = text[text.index("reward.weights ("):text.index("reward.kwargs (")]
    assert "imported and called" in weights_help and "os:system" in weights_help and "trust" in weights_help
    assert "Trust: a config is code." in text and "MMGRPO_REWARD_TOKEN" in text
