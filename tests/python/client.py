"""Drives the gateway with the real OpenAI Python client (tests/gateway/openai.rs runs it).

    python client.py http://127.0.0.1:PORT/v1

Chats (whole and streamed, several turns on a shared system prompt) and text completions
(whole and streamed) against mock workers, which answer " ok" then " done". Every answer is
checked; the script prints one JSON line of totals for the Rust test to check, and exits
non-zero on the first wrong answer.
"""

import json
import sys

import openai

SYSTEM = "You are the routing test's assistant. Keep answers short and about caches."


def main(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=20)
    totals = {"requests": 0, "streamed": 0, "prompt_tokens": 0, "cached_tokens": 0}

    def count(usage, streamed):
        assert usage is not None, "no usage"
        totals["requests"] += 1
        totals["streamed"] += int(streamed)
        totals["prompt_tokens"] += usage.prompt_tokens
        details = usage.prompt_tokens_details
        totals["cached_tokens"] += details.cached_tokens if details else 0

    for turn in range(3):
        for chat in range(6):
            messages = [{"role": "system", "content": SYSTEM}]
            for earlier in range(turn):
                messages.append({"role": "user", "content": f"Chat {chat}, question {earlier}?"})
                messages.append({"role": "assistant", "content": "ok done"})
            messages.append({"role": "user", "content": f"Chat {chat}, question {turn}?"})
            if chat % 2 == 0:
                answer = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
                assert answer.choices[0].message.content == " ok done", answer
                count(answer.usage, False)
            else:
                stream = client.chat.completions.create(
                    model="m", messages=messages, max_tokens=2, stream=True,
                    stream_options={"include_usage": True},
                )
                text, usage = stream_text(stream, lambda c: c.delta.content)
                assert text == " ok done", text
                count(usage, True)

    prompt = "The router sends each request to the worker that holds the longest prefix."
    for i in range(4):
        if i % 2 == 0:
            answer = client.completions.create(model="m", prompt=prompt, max_tokens=2)
            assert answer.choices[0].text == " ok done", answer
            count(answer.usage, False)
        else:
            stream = client.completions.create(
                model="m", prompt=prompt, max_tokens=2, stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = stream_text(stream, lambda c: c.text)
            assert text == " ok done", text
            count(usage, True)

    print(json.dumps(totals))


def stream_text(stream, content):
    """The streamed text and the usage chunk's usage."""
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += content(chunk.choices[0]) or ""
        if chunk.usage is not None:
            usage = chunk.usage
    return text, usage


if __name__ == "__main__":
    main(sys.argv[1])
