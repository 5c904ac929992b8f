"""dpkd_jax.train.progress: the bar's clock starts after the compiling first update."""

import pytest

from dpkd_jax.train import progress


def test_the_bar_opens_at_the_first_update_with_compilation_apart(capsys):
  bar = progress.StepBar(total=10, initial=2, desc="DPDFD digits", unit="step")
  assert "DPDFD digits: compiling the first step" in capsys.readouterr().err
  bar.set_postfix(eps="1.5")  # before the bar exists: kept for it
  bar.update(1)  # the first (compiling) step: the tqdm bar starts here, after it
  assert bar._bar.n == 3 and bar._bar.total == 10
  assert "first" in bar._bar.postfix and "eps=1.5" in bar._bar.postfix
  bar.update(2)
  bar.set_postfix(loss=progress.readable(226787.312))
  assert bar._bar.n == 5
  assert "loss=2.27e+05" in bar._bar.postfix and "first" in bar._bar.postfix
  bar.close()


def test_the_default_unit_is_named_a_step(capsys):
  progress.StepBar(total=2, desc="teacher").close()
  assert "teacher: compiling the first step" in capsys.readouterr().err


def test_a_disabled_bar_prints_nothing(capsys):
  with progress.StepBar(total=3, desc="x", disable=True) as bar:  # nothing, not even the line
    for _ in range(3):
      bar.update(1)
    bar.set_postfix(loss="1")
  assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value, text", [(226787.312, "2.27e+05"), (0.012345, "0.0123"),
                                         (4.5678, "4.57"), (0.0, "0")])
def test_readable_numbers_have_three_significant_digits(value, text):
  assert progress.readable(value) == text
