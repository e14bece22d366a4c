"""The MBPP DataModule: an endless, resumable stream of prompt batches for GRPO.

A training step consumes one batch of ``prompts_per_step`` tasks; each task travels with the columns
the rewards need (``test_list``, ``test_setup_code``, ``task_id``, ``entry_point``, and ``hidden_tests``
when their cache is built: ``rlcode.data.hidden_tests``). The order is a
seeded shuffle per epoch, so it is the same on every run with the same seed, and each rank of a
distributed run takes its own slice of it (``order[rank::world_size]``). The stream never ends by
itself: ``trainer.max_steps`` does.

Resuming: the stream's position (epoch, batches taken in that epoch) is the DataModule's state, which
Lightning stores in checkpoints (``state_dict``/``load_state_dict``). The position advances in
``on_before_batch_transfer``, which Lightning calls for the batch a training step is about to use,
not when the loader prefetches the next one, so a checkpoint written after step N resumes at batch
N + 1 exactly.

Evaluation tasks (``eval_split``) are not part of the stream: the MBPP eval callback asks for them
with ``eval_tasks()`` and scores them with the policy itself; ``rlcode validate`` / ``test`` read them
from ``val_dataloader`` / ``test_dataloader`` in batches of ``eval_batch_size``, shortest prompts first.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Annotated, Any, Collection, Iterator

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from rlcode.data.curriculum import Curriculum, CurriculumSettings
from rlcode.data.hidden_tests import hidden_tests_by_task
from rlcode.data.humaneval import load_humaneval
from rlcode.data.mbpp import ENV_VAR, HUB_ID, MBPPTask, load_mbpp
from rlcode.data.prompts import PROMPT_FORMATS, PromptFormat, build_prompt, length_order
from rlcode.platform import default_eval_batch_size
from rlcode.setting import COUNT, SEED, check_arguments, free

PromptBatch = dict[str, list]  # column name -> one value per prompt (TRL's dataset-column layout)


def epoch_order(num_tasks: int, seed: int, epoch: int) -> list[int]:
    """Task indices of one epoch: a shuffle seeded by (seed, epoch), the same on every rank."""
    order = list(range(num_tasks))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return order


def rank_batches(num_tasks: int, batch_size: int, seed: int, epoch: int, rank: int,
                 world_size: int) -> list[list[int]]:
    """This rank's batches of one epoch; a last partial batch is dropped so ranks stay in step."""
    order = epoch_order(num_tasks, seed, epoch)
    per_round = batch_size * world_size
    shard = order[: len(order) // per_round * per_round][rank::world_size]
    return [shard[i:i + batch_size] for i in range(0, len(shard), batch_size)]


class PromptStream(IterableDataset):
    """Iterable of prompt batches starting at the DataModule's saved position (main process only)."""

    def __init__(self, datamodule: MBPPDataModule) -> None:
        super().__init__()
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[PromptBatch]:
        dm = self.datamodule
        epoch, offset = dm.position["epoch"], dm.position["batch"]
        if dm.curriculum is not None:  # which problems is decided when the step takes the batch
            for index in itertools.count(offset):
                yield {"position": (0, index), "curriculum_draw": index}
        while True:
            batches = rank_batches(len(dm.train_tasks), dm.prompts_per_step, dm.seed, epoch,
                                   dm.rank, dm.world_size)
            for index in range(offset, len(batches)):
                yield dm.make_batch([dm.train_tasks[i] for i in batches[index]], epoch, index)
            epoch, offset = epoch + 1, 0


class MBPPDataModule(L.LightningDataModule):
    def __init__(
        self,
        source: Annotated[str, free()] | None = None,
        train_split: Annotated[str, free()] = "train",
        eval_split: Annotated[str, free()] = "validation",
        num_train_tasks: Annotated[int, free(COUNT)] | None = None,
        prompts_per_step: Annotated[int, free(COUNT)] = 4,
        prompt_format: Annotated[PromptFormat, free()] = "chat",
        seed: Annotated[int, free(SEED)] = 0,
        num_eval_tasks: Annotated[int, free(COUNT)] | None = None,
        eval_batch_size: Annotated[int, free(COUNT)] | None = None,
        curriculum: Annotated[CurriculumSettings, free()] | None = None,
    ) -> None:
        """MBPP prompts for training and tasks for evaluation.

        Args:
            source: MBPP data: a file, folder or hub id; None reads ``MBPP_DATASET_PATH``, and
                without it the hub copy (``google-research-datasets/mbpp``).
            train_split: split the training prompts come from ("train" = tasks 601-974).
            eval_split: split the MBPP eval callback scores ("validation" = tasks 511-600;
                "selection" = prompt + validation, for choosing recipes off the test split).
            num_train_tasks: use only the first N training tasks (by task id); None = all.
            prompts_per_step: distinct prompts per training step and rank; each is sampled
                ``model.mode.init_args.num_generations`` times.
            prompt_format: "chat" (instruct models: chat template) or "plain" (the MBPP paper's
                format for base models).
            seed: seeds the per-epoch shuffle of the training prompts.
            num_eval_tasks: first N tasks scored by ``rlcode validate`` / ``rlcode test`` (None: the
                whole split); during ``fit`` the MBPP eval callback's ``num_questions`` applies.
            eval_batch_size: problems generated together by ``rlcode validate`` / ``rlcode test`` and,
                unless it sets its own, the MBPP eval callback. Only speed depends on it (greedy
                completions are the same at any size). None: 16 on CPU, 32 on a GPU.
            curriculum: draw each step's prompts preferring problems the policy sometimes solves
                (``rlcode.data.curriculum``: estimates from the groups already scored, an
                exploration share for unseen and stale problems); None: the seeded shuffle.
        """
        super().__init__()
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt_format {prompt_format!r}: use one of {', '.join(PROMPT_FORMATS)}")
        check_arguments(MBPPDataModule, locals(), prefix="data.")  # Python callers; the CLI checked before building
        self.source = source or os.environ.get(ENV_VAR) or HUB_ID
        self.train_split = train_split
        self.eval_split = eval_split
        self.num_train_tasks = num_train_tasks
        self.prompts_per_step = prompts_per_step
        self.prompt_format = prompt_format
        self.seed = seed
        self.num_eval_tasks = num_eval_tasks
        self.eval_batch_size = eval_batch_size
        self.curriculum_settings = curriculum
        self.curriculum: Curriculum | None = None  # built with the training tasks
        self.train_tasks: list[MBPPTask] = []
        # What validate / test and the eval callback score: "mbpp" (eval_split, and the test split for
        # `rlcode test`) or "humaneval" (its 164 problems for both). Set by the eval callback
        # (``eval.benchmark``), which owns the setting.
        self.eval_benchmark = "mbpp"
        self.position = {"epoch": 0, "batch": 0}
        self._eval_tasks: list[MBPPTask] | None = None
        self._hidden_tests: dict[int, list[str]] | None = None
        self._hidden_tests_read = False

    # ---- distributed layout -----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    # ---- Lightning hooks --------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit" and not self.train_tasks:
            tasks = load_mbpp(self.source, split=self.train_split)
            self.train_tasks = tasks[: self.num_train_tasks] if self.num_train_tasks else tasks
            needed = self.prompts_per_step * self.world_size
            if len(self.train_tasks) < needed:
                raise ValueError(
                    f"{len(self.train_tasks)} training tasks cannot fill one step of {self.prompts_per_step} "
                    f"prompts on {self.world_size} rank(s): raise data.num_train_tasks or lower data.prompts_per_step")
        if stage == "fit" and self.curriculum_settings is not None and self.curriculum is None:
            self.curriculum = Curriculum(self.curriculum_settings, len(self.train_tasks), self.seed)

    def train_dataloader(self):
        # batch_size=None: the stream yields whole batches; workers=0 keeps the position in this process.
        return DataLoader(PromptStream(self), batch_size=None, num_workers=0)

    def val_dataloader(self):
        """``eval_split`` tasks for ``rlcode validate`` (fit evaluates through the MBPP eval callback)."""
        return self._eval_loader(self.eval_tasks(self.num_eval_tasks))

    def test_dataloader(self):
        """MBPP's test split (tasks 11-510) for ``rlcode test`` (HumanEval under ``eval.benchmark: humaneval``)."""
        if self.eval_benchmark == "humaneval":
            return self._eval_loader(self.eval_tasks(self.num_eval_tasks))
        tasks = load_mbpp(self.source, split="test")
        return self._eval_loader(tasks[: self.num_eval_tasks] if self.num_eval_tasks else tasks)

    def resolved_eval_batch_size(self) -> int:
        """``eval_batch_size``, or when None the default for the device the trainer runs on."""
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        device = self.trainer.strategy.root_device.type if self.trainer is not None else "cpu"
        return default_eval_batch_size(device)

    def _eval_loader(self, tasks: list[MBPPTask]):
        # Not prompts_per_step: a training step's 2-4 prompts make a slow eval batch.
        size = self.resolved_eval_batch_size()
        # Shortest prompts first, so each batch is padded little; the pass rate is a sum over tasks.
        tasks = [tasks[i] for i in length_order([build_prompt(t, self.prompt_format) for t in tasks])]
        batches = []
        for start in range(0, len(tasks), size):
            batch = self.make_batch(tasks[start:start + size], 0, start)
            del batch["position"]  # evaluation never moves the training stream
            if self.eval_benchmark == "humaneval":  # scoring runs prompt + completion (rlcode.data.humaneval)
                batch["program_prefix"] = [t.program_prefix for t in tasks[start:start + size]]
            batches.append(batch)
        return DataLoader(batches, batch_size=None, num_workers=0)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and "curriculum_draw" in batch:
            # Drawn now, not when the loader prefetched: the estimates include the previous step.
            index = batch["curriculum_draw"]
            drawn = self.curriculum.draw(index, self.prompts_per_step * self.world_size)
            mine = drawn[self.rank * self.prompts_per_step:(self.rank + 1) * self.prompts_per_step]
            batch = self.make_batch([self.train_tasks[i] for i in mine], 0, index)
        if isinstance(batch, dict) and "position" in batch:
            epoch, index = batch["position"]
            self.position = {"epoch": epoch, "batch": index + 1}
        return batch

    def extra_batch(self, draw: int, round_: int, epoch: int = 0, drawn: Collection[Any] = ()) -> PromptBatch:
        """More prompts for the step that took batch ``draw`` of ``epoch`` (dynamic sampling's round
        ``round_``): a function of (seed, epoch, draw, round, rank, ``drawn``), so a resumed run draws
        the same; the curriculum's rule when there is one, else uniform. ``drawn``: task ids this step
        already generated for, left out while others remain (their groups were just scored under the
        same estimates). The stream's position does not move."""
        n, salt = self.prompts_per_step, f"-extra-{round_}-{self.rank}"
        avoid = frozenset(i for i, task in enumerate(self.train_tasks) if task.task_id in set(drawn))
        if self.curriculum is not None:
            problems = self.curriculum.draw(draw, n, salt=salt, avoid=avoid)
        else:  # the epoch too: batch indices start again at 0 each epoch
            rest = [i for i in range(len(self.train_tasks)) if i not in avoid]
            pool = rest if len(rest) >= n else range(len(self.train_tasks))
            problems = random.Random(f"{self.seed}-{epoch}-{draw}{salt}").sample(pool, n)
        batch = self.make_batch([self.train_tasks[i] for i in problems], 0, draw)
        del batch["position"]
        return batch

    def record_outcomes(self, draw: int, task_ids: list[Any], success_shares: list[float]) -> None:
        """Feed the curriculum one step's scored groups: every rank's, in rank order, so that all
        ranks hold the same estimates (a no-op without a curriculum)."""
        if self.curriculum is not None:
            index_of = {task.task_id: i for i, task in enumerate(self.train_tasks)}
            self.curriculum.observe(draw, [index_of[t] for t in task_ids], success_shares)

    def state_dict(self) -> dict[str, Any]:
        state = {"position": dict(self.position), "seed": self.seed, "prompts_per_step": self.prompts_per_step}
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def state_before(self, batch) -> dict[str, Any]:
        """The state as it was before the training ``batch`` was taken (a step given up puts it back)."""
        state = self.state_dict()
        if isinstance(batch, dict) and "position" in batch:
            epoch, index = batch["position"]
            state["position"] = {"epoch": epoch, "batch": index}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # validate/test restore a checkpoint's state too, but only a fit goes on to draw prompts from it
        fitting = self.trainer is None or self.trainer.state.fn == TrainerFn.FITTING
        if fitting and (state_dict.get("seed", self.seed) != self.seed or state_dict.get(
                "prompts_per_step", self.prompts_per_step) != self.prompts_per_step):
            # Resuming with another shuffle would silently repeat and skip prompts: say so, keep going.
            rank_zero_warn("data.seed or data.prompts_per_step differ from the checkpoint's: the prompt order "
                           "after resuming is not the one the run started with")
        self.position = dict(state_dict["position"])
        if self.curriculum is not None and "curriculum" in state_dict:  # setup ran first: it exists
            self.curriculum.load_state_dict(state_dict["curriculum"])

    # ---- batches and eval tasks -------------------------------------------------------------
    def make_batch(self, tasks: list[MBPPTask], epoch: int, index: int) -> PromptBatch:
        """Column layout of a batch: every reward gets these lists, one entry per prompt."""
        return {
            "task_id": [t.task_id for t in tasks],
            "prompt": [build_prompt(t, self.prompt_format) for t in tasks],
            "test_list": [list(t.test_list) for t in tasks],
            "test_setup_code": [t.test_setup_code for t in tasks],
            "entry_point": [t.entry_point for t in tasks],
            "text": [t.text for t in tasks],  # multi-step MBPP writes its own prompts and feedback
            "challenge_test_list": [list(t.challenge_test_list) for t in tasks],
            "position": (epoch, index),
            **self._hidden_column(tasks),
        }

    def _hidden_column(self, tasks: list[MBPPTask]) -> dict[str, list]:
        """``hidden_tests`` per task from the data file's cache, read once; no column without a cache
        (the hidden-test rewards then warn and score the visible asserts)."""
        if not self._hidden_tests_read:
            self._hidden_tests_read = True
            self._hidden_tests = hidden_tests_by_task(self.source)
        if self._hidden_tests is None:
            return {}
        return {"hidden_tests": [list(self._hidden_tests.get(t.task_id, ())) for t in tasks]}

    def eval_tasks(self, num_questions: int | None = None) -> list[MBPPTask]:
        """The first ``num_questions`` tasks of ``eval_split`` (all when None), loaded once; HumanEval's
        problems instead under ``eval_benchmark == "humaneval"``."""
        if self.eval_benchmark == "humaneval":
            return load_humaneval(num_questions)
        if self._eval_tasks is None:
            self._eval_tasks = load_mbpp(self.source, split=self.eval_split)
        return self._eval_tasks[:num_questions] if num_questions else list(self._eval_tasks)

