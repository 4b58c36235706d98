"""The real OpenAI Python client against a refusal (tests/gateway/openai.rs runs it).

    python shed.py http://127.0.0.1:PORT/v1

A text completion asking for a time to first token no worker can meet (the
`x-ttft-target-ms: 1` header: a prompt's own prefill takes longer) is refused with 429. The
client retries it as it retries any 429 (max_retries=2; the Rust test counts the attempts
in the gateway's /stats) and then raises RateLimitError carrying the gateway's error. The
same request marked critical (`x-priority: critical`) is served. The models are listed
first, as clients do. Prints one JSON line for the Rust test to check.
"""

import json
import sys

import openai

PROMPT = "The router sends each request to the worker that holds the longest prefix. " * 20


def main(base_url):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=20)
    models = [m.id for m in client.models.list()]
    refused = None
    try:
        client.completions.create(
            model="m", prompt=PROMPT, max_tokens=2, extra_headers={"x-ttft-target-ms": "1"}
        )
    except openai.RateLimitError as e:
        refused = {
            "status": e.status_code,
            "type": e.type,
            "code": e.code,
            "message": str(e.message),
        }
    if refused is None:
        sys.exit("a request no worker can serve within 1 ms was served")
    answer = client.completions.create(
        model="m",
        prompt=PROMPT,
        max_tokens=2,
        extra_headers={"x-ttft-target-ms": "1", "x-priority": "critical"},
    )
    assert answer.choices[0].text == " ok done", answer
    print(json.dumps({"models": models, "refused": refused, "critical": "served"}))


if __name__ == "__main__":
    main(sys.argv[1])
