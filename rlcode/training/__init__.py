"""The training step shared by every mode: the Learner (the one LightningModule), the Mode contract
(``mode.py``, what a mode provides), advantage estimators, the experience a step learns from, the
policy update, DDP agreement, exact resume and the step's record. Modes live one layer up
(``rlcode.modes``); nothing here imports them."""
