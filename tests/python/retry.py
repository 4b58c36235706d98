"""The real OpenAI Python client retries a refusal and is served (tests/gateway/openai.rs runs it).

    python retry.py http://127.0.0.1:PORT/v1

Once the client is built the script prints "ready" and waits for a line on stdin; the Rust
test then fills the gateway's only worker with slow requests and writes "go", so that a
completion asking for its first token within 300 ms (`x-ttft-target-ms: 300`) is refused
with 429 and a Retry-After of whole seconds. The client retries a 429 on its own
(max_retries=2), waiting the Retry-After it was given; by then the worker's requests are
done and the retry is served. Every response the client's HTTP layer saw is recorded by an
event hook. Prints one JSON line for the Rust test to check; exits non-zero when the request
is not served.
"""

import json
import sys
import time

import openai

PROMPT = "The router sends each request to the worker that holds the longest prefix."


def main(base_url):
    seen = []

    def record(response):
        seen.append(
            {
                "at": time.monotonic(),
                "status": response.status_code,
                "retry_after": response.headers.get("retry-after"),
            }
        )

    http = openai.DefaultHttpxClient(event_hooks={"response": [record]})
    client = openai.OpenAI(
        base_url=base_url, api_key="unused", max_retries=2, timeout=20, http_client=http
    )
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit("the test did not say go")
    raw = client.completions.with_raw_response.create(
        model="m", prompt=PROMPT, max_tokens=2, extra_headers={"x-ttft-target-ms": "300"}
    )
    answer = raw.parse()
    assert answer.choices[0].text == " ok done", answer
    waits = [later["at"] - earlier["at"] for earlier, later in zip(seen, seen[1:])]
    print(
        json.dumps(
            {
                "retries_taken": raw.retries_taken,
                "statuses": [r["status"] for r in seen],
                "retry_after": [r["retry_after"] for r in seen],
                "waits_s": waits,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
