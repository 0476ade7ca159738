"""The shipped calculator program (``ragen.gateway.examples.calculator``) through the program driver with a scripted
engine that writes a Hermes tool call, then the number the tool returned: the tool call is parsed and answered, the
answer scores 1, both calls merge into one row, and the reward sits on the answer's last token."""

import json
import re

from ragen.agent.config import AgentConfig
from ragen.agent.program_rollout import ProgramGroups, ProgramProxy
from ragen.gateway.examples.calculator import calculate, final_number, make_task
from ragen.rollout.base import Sample


class ToolUser:
    """First call of an episode: a calculator call on the question; later calls: the tool's result, or a wrong
    number when ``wrong``."""

    def __init__(self, tok, wrong=False):
        self.tok, self.wrong, self.calls = tok, wrong, 0

    def generate(self, prompts, sampling):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            results = re.findall(r"<\|im_start\|>tool\n(-?\d+)<\|im_end\|>", text)
            if results:
                reply = str(int(results[-1]) + (1 if self.wrong else 0))
            else:
                a, b, c = re.findall(r"What is (\d+) \* (\d+) \+ (\d+)\?", text)[-1]
                call = {"name": "calculator", "arguments": {"expression": f"{a} * {b} + {c}"}}
                reply = f"<tool_call>{json.dumps(call)}</tool_call>"
            ids = list(self.tok(reply, add_special_tokens=False)["input_ids"]) + [sampling.stop_token_ids[0]]
            out.append(Sample(ids, [-0.5] * len(ids), "stop"))
        self.calls += 1
        return out


def rollout(tok, wrong):
    groups = ProgramGroups({"entry": "ragen.gateway.examples.calculator:run"}, 2, 2)
    agent = AgentConfig(max_new_tokens=64, max_model_len=2048)
    return ProgramProxy(ToolUser(tok, wrong), tok, agent, groups, groups, seed=3).rollout("train")


def test_the_calculator_program_uses_its_tool_and_scores_the_answer(default_tokenizer):
    batch = rollout(default_tokenizer, wrong=False)
    assert batch.batch_size == 4 and not batch.failed.any()
    assert batch.metrics["env/agent_program/reward"] == 1.0 and batch.metrics["env/agent_program/format_ok"] == 1.0
    assert batch.metrics["gateway/merged_turns"] == 4.0 and batch.metrics["gateway/forks"] == 0.0
    for i in range(4):
        turns = batch.turn_ids[i]
        last = int((turns == 1).nonzero().flatten()[-1])
        assert batch.token_rewards[i].nonzero().flatten().tolist() == [last]
        assert batch.token_rewards[i, last] == 1.0 and batch.turn_rewards[i].tolist() == [0.0, 1.0]
        text = default_tokenizer.decode(batch.input_ids[i, : last + 1].tolist())
        assert "<tool_call>" in text and "<|im_start|>tool\n" in text
    assert rollout(default_tokenizer, wrong=True).metrics["env/agent_program/reward"] == 0.0


def test_the_calculator_tool():
    assert calculate("37 * 12 + 5") == "449" and calculate("7 / 2") == "3.5"
    assert calculate("__import__('os')").startswith("error") and calculate("1 / 0").startswith("error")
    assert final_number("it is 449.") == 449.0 and final_number("no idea") is None
    task = make_task(5)
    assert task == make_task(5) and calculate(task["question"][8:-1]) == str(task["answer"])
