"""The README's agent program ("Your agent program"), as a module the documented commands can name."""

import json
import urllib.request


def run(base_url, api_key, task, seed):  # sync or async; one call per episode
    messages = [{"role": "user", "content": f"What is {seed} + 1? Answer with the number."}]
    body = {"model": "ragen", "messages": messages}
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(req).read())["choices"][0]["message"]["content"]
    return float(answer.strip() == str(seed + 1))  # the reward
