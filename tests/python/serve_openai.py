"""redco-serve against the real `openai` client and a transformers reference.

    serve_openai.py <redco-serve> <tests/fixtures/hf/gpt2_text> <scratch folder>

Two servers: the GPT-2 text fixture (with a chat template added to its
tokenizer_config.json) for what requests return, and a wider random GPT-2
(slow enough that a request is still running when the test acts on it) for
back-pressure and disconnects. Every completion is compared with greedy
decoding in transformers 4.46 on the same checkpoint; the chat prompt with
transformers' apply_chat_template. Exits 1 naming the first failure.
"""
import concurrent.futures as cf
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import torch
import transformers

serve_bin, fixture, scratch = sys.argv[1:4]
run_bin = sys.argv[4] if len(sys.argv) > 4 else None  # redco-run: the tensor-parallel server
generate_bin = os.environ.get("REDCO_GENERATE")  # redco-generate: the int8 server's reference

# A short template: the fixture's tokenizer spends a token per character.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<s>\n{% endif %}"
    "<{{ m['role'][0] }}>{{ m['content'] | trim }}\n{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(ok, msg):
    if not ok:
        fail(msg)


def chat_folder():
    d = os.path.join(scratch, "chat")
    shutil.copytree(fixture, d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
                   "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, f)
    return d


def slow_folder():
    """A random GPT-2 wide enough to take seconds for 1000 tokens."""
    d = os.path.join(scratch, "slow")
    cfg = transformers.GPT2Config(vocab_size=2001, n_positions=2048, n_embd=512, n_layer=4,
                                  n_head=8, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d, safe_serialization=True)
    shutil.copy(os.path.join(fixture, "tokenizer.json"), d)
    return d


def start(folder, *flags):
    return start_with([serve_bin], folder, *flags)


def start_with(command, folder, *flags):
    p = subprocess.Popen([*command, folder, "--port", "0", *flags], stderr=subprocess.PIPE,
                         text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        p.kill()
        fail(f"redco-serve did not start: {line}{p.stderr.read()}")
    threading.Thread(target=lambda: [sys.stderr.write(l) for l in p.stderr], daemon=True).start()
    return p, m.group(1)


def stop(p, status=0):
    """SIGTERM; redco-run reports it as 128 + 15 once its ranks have ended,
    which they must do well within its 10 s grace (rank 0 releases the others)."""
    begin = time.time()
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=30) == status, f"redco-serve exited with {p.returncode} on SIGTERM")
    check(time.time() - begin < 8, f"redco-serve took {time.time() - begin:.1f} s to stop")


class Reference:
    def __init__(self, folder):
        self.model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
        self.tok = transformers.AutoTokenizer.from_pretrained(folder)

    def greedy(self, ids, n, eos=0):
        out = []
        with torch.no_grad():
            x = torch.tensor([ids])
            for _ in range(n):
                t = int(self.model(x).logits[0, -1].argmax())
                out.append(t)
                if t == eos:
                    break
                x = torch.cat([x, torch.tensor([[t]])], 1)
        return out

    def text(self, ids, n):
        new = self.greedy(ids, n)
        return self.tok.decode(new, skip_special_tokens=True), new


def metrics(url):
    text = httpx.get(url + "/metrics").text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(redco_[a-z_]+) ([0-9.e+-]+)$", text, re.M)}


def wait_idle(url, rows, seconds):
    """True when, within `seconds`, nothing runs, every row is free and no
    KV cache block leaked: each is free or held by a stored prompt alone."""
    end = time.time() + seconds
    while time.time() < end:
        m = metrics(url)
        if (m.get("redco_requests_running") == 0 and m.get("redco_kv_rows_free") == rows
                and m.get("redco_kv_blocks", -1) > 0
                and m.get("redco_kv_blocks_free", 0) + m.get("redco_kv_blocks_stored", 0)
                == m.get("redco_kv_blocks")):
            return True
        time.sleep(0.05)
    return False


def idle(url, rows, after):
    check(wait_idle(url, rows, 5), f"rows or KV blocks not freed after {after}: {metrics(url)}")


def test_completions(client, ref, name):
    prompt = "In the beginning God created"
    want, new = ref.text(ref.tok(prompt)["input_ids"], 12)
    r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
    check(r.choices[0].text == want, f"completion {r.choices[0].text!r} != transformers {want!r}")
    check(r.usage.prompt_tokens == len(ref.tok(prompt)["input_ids"]), f"usage {r.usage}")
    check(r.usage.completion_tokens == len(new), f"usage {r.usage} for {len(new)} tokens")
    check(r.choices[0].finish_reason == ("stop" if new[-1] == 0 else "length"),
          f"finish_reason {r.choices[0].finish_reason}")
    # Streamed: the same text in several events, the last with the reason.
    pieces, reasons = [], []
    for chunk in client.completions.create(model=name, prompt=prompt, max_tokens=12,
                                           temperature=0, stream=True):
        pieces.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    check("".join(pieces) == want, f"streamed {''.join(pieces)!r} != {want!r}")
    check(len([p for p in pieces if p]) > 1 and reasons[-1] == r.choices[0].finish_reason,
          f"stream pieces {pieces} reasons {reasons}")
    # A stop string: the text ends before it.
    stop = want[len(want) // 2:len(want) // 2 + 3]
    r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                  stop=[stop])
    check(r.choices[0].text == want[:want.find(stop)] and r.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {r.choices[0].text!r}, {r.choices[0].finish_reason}")
    # Token ids as the prompt; seeded sampling repeats itself.
    ids = ref.tok(prompt)["input_ids"]
    r = client.completions.create(model=name, prompt=ids, max_tokens=12, temperature=0)
    check(r.choices[0].text == want, "a prompt of token ids")
    a, b = (client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0.9,
                                      seed=5).choices[0].text for _ in range(2))
    check(a == b, f"seeded sampling differs: {a!r} vs {b!r}")


def test_prefix_reuse(client, ref, name, url):
    """Prompts sharing a long beginning: the later ones take its keys and values
    from the prefix cache, and their texts still equal transformers'."""
    verse = ("In the beginning God created the heaven and the earth. And the earth was "
             "without form, and void; and darkness was upon the face of the deep.")
    before = metrics(url)["redco_prompt_tokens_reused_total"]
    prompts = [verse, verse, verse[:-1] + " and light."]
    for p in prompts:
        want, _ = ref.text(ref.tok(p)["input_ids"], 8)
        r = client.completions.create(model=name, prompt=p, max_tokens=8, temperature=0)
        check(r.choices[0].text == want, f"prefix reuse: {r.choices[0].text!r} != {want!r}")
    reused = metrics(url)["redco_prompt_tokens_reused_total"] - before
    n = len(ref.tok(verse)["input_ids"])
    check(reused >= (n - 1) + 16, f"{reused} prompt tokens reused of {n}-token prompts")


def test_chat(client, ref, name):
    messages = [{"role": "system", "content": "Brief."}, {"role": "user", "content": "Light?"}]
    ids = ref.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    check(len(ids) + 10 <= 64, f"the chat prompt's {len(ids)} tokens leave no room in 64")
    want, _ = ref.text(ids, 10)
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=10,
                                       temperature=0)
    check(r.choices[0].message.role == "assistant" and r.choices[0].message.content == want,
          f"chat {r.choices[0].message} != transformers {want!r}")
    check(r.usage.prompt_tokens == len(ids), f"chat usage {r.usage} for {len(ids)} prompt ids")
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=10,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(text == want, f"streamed chat {text!r} != {want!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          f"usage chunk {chunks[-1]}")


def test_errors(client, url, name):
    def refused(kind, fn, says):
        try:
            fn()
        except kind as e:
            check(says in str(e), f"{kind.__name__} without {says!r}: {e}")
            return
        fail(f"expected {kind.__name__} ({says})")

    p = "In the"
    refused(openai.NotFoundError, lambda: client.completions.create(model="nope", prompt=p),
            "model 'nope' is not served here")
    refused(openai.BadRequestError,
            lambda: client.completions.create(model=name, prompt=p, max_tokens=63),
            "exceed the context of 64")
    refused(openai.BadRequestError,
            lambda: client.completions.create(model=name, prompt=p, temperature=3), "temperature")
    refused(openai.BadRequestError,
            lambda: client.completions.create(model=name, prompt=p, n=2), "'n' must be 1")
    refused(openai.BadRequestError,
            lambda: client.completions.create(model=name, prompt=p, extra_body={"bogus": 1}),
            "unknown field 'bogus'")
    refused(openai.BadRequestError,
            lambda: client.completions.create(model=name, prompt="x " * 200), "context holds 64")
    refused(openai.BadRequestError,
            lambda: client.chat.completions.create(model=name, messages=[]), "messages")
    r = httpx.post(url + "/v1/completions", content=b"{not json")
    check(r.status_code == 400 and "not JSON" in r.json()["error"]["message"], f"bad JSON: {r.text}")
    r = httpx.get(url + "/v1/nothing")
    check(r.status_code == 404 and "no route" in r.json()["error"]["message"], r.text)
    models = client.models.list()
    check([m.id for m in models.data] == [name], f"models {models}")
    check(httpx.get(url + "/health").json() == {"status": "ok"}, "health")


def test_concurrent(client, ref, name, url):
    """1000 requests from 256 clients at once: each gets its own reference text or a 429."""
    prompts = [f"And the {w} was" for w in ["earth", "light", "water", "day", "night", "evening",
                                             "morning", "heaven"]]
    wants = [ref.text(ref.tok(p)["input_ids"], 8)[0] for p in prompts]

    def one(i):
        try:
            pieces = client.completions.create(model=name, prompt=prompts[i % 8], max_tokens=8,
                                               temperature=0, stream=(i % 2 == 0))
            text = "".join(c.choices[0].text for c in pieces) if i % 2 == 0 else pieces.choices[0].text
            return "ok" if text == wants[i % 8] else f"wrong text {text!r} for {i}"
        except openai.RateLimitError:
            return "busy"

    with cf.ThreadPoolExecutor(256) as pool:
        results = list(pool.map(one, range(1000)))
    wrong = [r for r in results if r not in ("ok", "busy")]
    check(not wrong, f"concurrent: {wrong[:3]}")
    check(results.count("ok") >= 500, f"concurrent: only {results.count('ok')} of 1000 served")
    print(f"concurrent: {results.count('ok')} served, {results.count('busy')} refused (429)")
    check(wait_idle(url, 4, 5), f"rows not freed after the concurrent run: {metrics(url)}")


def test_backpressure_and_disconnect(url):
    """One row, no queue: a second request is refused while the first runs;
    a client that leaves mid-stream frees the row at once."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    body = {"prompt": "In the beginning", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        events = 0
        for line in lines:
            events += line.startswith("data: ")
            if events == 3:
                break
        check(events == 3, "the long request did not stream")
        try:
            client.completions.create(model="slow", prompt="In", max_tokens=4)
            fail("a request beyond the one row and empty queue was served, not refused")
        except openai.RateLimitError as e:
            check("busy" in str(e), f"429's message: {e}")
        before = metrics(url)["redco_generation_tokens_total"]
    # The stream is closed: the row comes back long before 1500 tokens.
    check(wait_idle(url, 1, 3), f"the row was not freed after the client left: {metrics(url)}")
    spent = metrics(url)["redco_generation_tokens_total"]
    print(f"disconnect: {before:.0f} tokens when the client left, {spent:.0f} in all")
    check(spent < 1000, f"{spent} tokens generated for a client that left after {before}")


def test_tensor_parallel(single, url, ref):
    """redco-run -n 2 redco-serve --n-model-shards 2: the same text as one
    process, greedy and seeded sampling, whole and streamed, chat, several
    clients at once; every row and block free after."""
    tp = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    test_completions(tp, ref, "tiny")
    test_chat(tp, ref, "tiny")
    prompts = [f"And the {w} was" for w in ["earth", "light", "water", "day"]]
    for p in prompts:
        kw = dict(model="tiny", prompt=p, max_tokens=10, temperature=0.9, seed=11)
        a, b = single.completions.create(**kw).choices[0].text, tp.completions.create(**kw).choices[0].text
        check(a == b, f"sampled on 2 shards {b!r} != 1 process {a!r}")
    wants = [ref.text(ref.tok(p)["input_ids"], 8)[0] for p in prompts]

    def one(i):
        pieces = tp.completions.create(model="tiny", prompt=prompts[i % 4], max_tokens=8,
                                       temperature=0, stream=(i % 2 == 0))
        text = "".join(c.choices[0].text for c in pieces) if i % 2 == 0 else pieces.choices[0].text
        return text == wants[i % 4]

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(32)))
    check(all(results), f"tensor parallel, 8 clients: {results.count(False)} of 32 wrong")
    idle(url, 4, "the tensor-parallel checks")
    print("tensor parallel: 2 shards serve what 1 process serves")


def test_int8(url, folder):
    """--dtype int8 (int8 matrices, in decode panels where they pay): the
    server's greedy completions equal redco-generate's on the same weights."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    for p in ["And the earth was", "In the beginning", "Then said"]:
        got = client.completions.create(model="tiny", prompt=p, max_tokens=8,
                                        temperature=0).choices[0].text
        out = subprocess.run([generate_bin, folder, "--prompt", p, "--max-new-tokens", "8",
                              "--dtype", "int8"], capture_output=True, text=True, check=True).stdout
        want = out[:-1] if out.endswith("\n") else out  # one line per prompt
        check(got == want, f"int8 server {got!r} != redco-generate --dtype int8 {want!r} for {p!r}")
    idle(url, 4, "the int8 completions")
    print("int8: the server's greedy completions equal redco-generate's")


def main():
    ref = Reference(chat_folder())
    slow = slow_folder()
    # A KV cache of 4096 tokens in blocks of 16 for 4 rows of 2048: a chat
    # without max_tokens reserves the whole context, so two run at once at
    # most; short completions fill all four rows.
    server, url = start(os.path.join(scratch, "chat"), "--slots", "4", "--max-queue", "16",
                        "--served-model-name", "tiny", "--kv-block", "16",
                        "--kv-cache-tokens", "4096")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        test_completions(client, ref, "tiny")
        idle(url, 4, "the completions")
        test_prefix_reuse(client, ref, "tiny", url)
        idle(url, 4, "the prefix reuse")
        test_chat(client, ref, "tiny")
        idle(url, 4, "the chats")
        test_errors(client, url, "tiny")
        idle(url, 4, "the errors")
        test_concurrent(client, ref, "tiny", url)
        m = httpx.get(url + "/metrics").text
        check('redco_requests_total{endpoint="completions",status="200"}' in m, m)
        if run_bin:
            tp_server, tp_url = start_with([run_bin, "-n", "2", "--output", "rank0", "--",
                                            serve_bin], os.path.join(scratch, "chat"), "--slots",
                                           "4", "--served-model-name", "tiny",
                                           "--n-model-shards", "2")
            try:
                test_tensor_parallel(client, tp_url, ref)
            finally:
                stop(tp_server, 128 + signal.SIGTERM)
            # 2 processes for 1 shard: 2 replicas, which one server is not.
            r = subprocess.run([run_bin, "-n", "2", "--output", "rank0", "--", serve_bin,
                                os.path.join(scratch, "chat"), "--port", "0"],
                               capture_output=True, text=True, timeout=120)
            check(r.returncode != 0 and "a server is one replica" in r.stderr,
                  f"2 replicas: {r.returncode} {r.stderr[-500:]}")
    finally:
        stop(server)
    if generate_bin:
        server, url = start(os.path.join(scratch, "chat"), "--slots", "4", "--dtype", "int8",
                            "--served-model-name", "tiny")
        try:
            test_int8(url, os.path.join(scratch, "chat"))
        finally:
            stop(server)
    server, url = start(slow, "--slots", "1", "--max-queue", "0", "--served-model-name", "slow")
    try:
        test_backpressure_and_disconnect(url)
    finally:
        stop(server)
    print("redco-serve: every check passed")


main()
