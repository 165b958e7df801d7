"""Remote reward client and server against hostile or broken peers (issue 14, item 6), all on 127.0.0.1.

Client tests talk to a raw-socket fake server that sends exactly the bytes a test chooses (wrong score counts,
wrongly typed JSON, a reply dripped one byte at a time, an announced 300 MB reply). Server tests run the reference
server in a thread and send raw requests to it. Every loop is bounded and every timeout short.
"""
import json
import socket
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from flow_grpo.rewards import RewardError
from flow_grpo.rewards.remote import RemoteReward, encode_images
from flow_grpo.rewards.server import make_server
from flow_grpo.scoring import ResilientReward
from mmgrpo.engine.errors import RewardCallFailed

IMGS = np.zeros((2, 8, 8, 3), dtype=np.uint8)


# ----------------------------------------------------------------------------------------------- client
def test_wrong_number_of_scores_is_a_failed_call_that_drop_drops(fake_http):
    reply = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [0.5]}})  # one score for two images
    with fake_http.serve(reply) as (url, _):
        client = RemoteReward(url, timeout=2, retries=0, name="r")
        with pytest.raises(RewardError, match=r"scores\['r'\] has 1 value.*2 images"):
            client(IMGS, ["a", "b"])
        dropping = ResilientReward(client, "r", retries=1, backoff=0.0, on_failure="drop")
        out = dropping.evaluate(IMGS, ["a", "b"])  # before the fix: a RewardError ended the run here
        assert out["valid"].tolist() == [False, False]
        assert dropping.counters["failed_calls"] == 1 and dropping.counters["dropped"] == 2
        with pytest.raises(RewardCallFailed, match="on_failure=stop"):
            ResilientReward(client, "r", retries=0, on_failure="stop").evaluate(IMGS, ["a", "b"])


def test_any_reward_returning_the_wrong_count_is_a_failed_call():
    def short(images, prompts, metadata):
        return np.ones(len(prompts) - 1)

    r = ResilientReward(short, "short", retries=1, backoff=0.0, on_failure="drop")
    out = r.evaluate(IMGS, ["a", "b"])
    assert out["valid"].tolist() == [False, False] and r.counters["retries"] == 1
    assert r.counters["failed_calls"] == 1


@pytest.mark.parametrize("scores, match", [
    ({"r": [1.0, 2.0], "valid": ["false", "false"]}, r"scores\['valid'\]\[0\] is 'false' \(str\).*true/false"),
    ({"r": [1.0, 2.0], "valid": [1, 0]}, r"scores\['valid'\]\[0\] is 1 \(int\)"),
    ({"r": ["1.0", 2.0]}, r"scores\['r'\]\[0\] is '1.0' \(str\).*number"),
    ({"r": [True, 2.0]}, r"scores\['r'\]\[0\] is True \(bool\)"),
    ({"r": 1.0}, r"scores\['r'\] is 1.0 \(float\), expected a list"),
])
def test_reply_types_are_validated(scores, match, fake_http):
    with fake_http.serve(fake_http.reply({"reward": "r", "n": 2, "scores": scores})) as (url, _):
        with pytest.raises(RewardError, match=match):
            RemoteReward(url, timeout=2, retries=0, name="r")(IMGS, ["a", "b"])


def test_reply_n_and_json_are_validated(fake_http):
    with fake_http.serve(fake_http.reply({"reward": "r", "n": 3, "scores": {"r": [1.0, 2.0]}})) as (url, _):
        with pytest.raises(RewardError, match="'n' is 3.*2 images"):
            RemoteReward(url, timeout=2, retries=0, name="r")(IMGS, ["a", "b"])
    with fake_http.serve(fake_http.reply(b"<html>proxy error</html>")) as (url, _):
        with pytest.raises(RewardError, match="not JSON"):
            RemoteReward(url, timeout=2, retries=0, name="r")(IMGS, ["a", "b"])


def test_valid_json_booleans_and_null_scores_are_accepted(fake_http):
    reply = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [1, None], "valid": [True, False]}})
    with fake_http.serve(reply) as (url, _):
        out = RemoteReward(url, timeout=2, retries=0, name="r", nan_policy="drop").evaluate(IMGS, ["a", "b"])
    assert out["r"][0] == 1.0 and np.isnan(out["r"][1]) and out["valid"].tolist() == [True, False]


@pytest.mark.parametrize("drip_from, status", [("start", "200 OK"), ("body", "200 OK"),
                                               ("body", "500 Internal Server Error")],
                         ids=["headers", "body", "error-body"])
def test_dripping_server_cannot_defeat_the_timeout(drip_from, status, fake_http):
    # one byte every 0.05 s: each socket read succeeds well within the 0.4 s timeout, the reply never completes.
    # "body": the status line and headers arrive at once and only the body drips (a fixed offset of 60 bytes cut
    # the 500 reply's headers, so whether "HTTP 500" could be seen before the deadline was a race)
    reply = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [1.0, 2.0]}, "error": "x" * 100}, status)
    drip_from = 0 if drip_from == "start" else reply.index(b"\r\n\r\n") + 4
    with fake_http.serve(reply, drip=0.05, drip_from=drip_from) as (url, _):
        client = RemoteReward(url, timeout=0.4, retries=0, name="r")
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match="HTTP 500" if status.startswith("500") else "timeout.*0.4 s"):
            client(IMGS, ["a", "b"])
        assert time.perf_counter() - t0 < 1.5  # before the fix: the whole drip, len(reply) * 0.05 s > 5 s


def test_announced_huge_reply_is_refused_before_reading(fake_http):
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 314572800\r\n"
            b"Connection: close\r\n\r\n{")
    with fake_http.serve(head) as (url, _):
        with pytest.raises(RewardError, match="314572800 bytes.*max_reply_mb=64"):
            RemoteReward(url, timeout=2, retries=3, name="r")(IMGS, ["a", "b"])


def test_streamed_reply_above_the_cap_is_cut_off(fake_http):
    body = b'{"reward": "r", "scores": {"r": [' + b"1.0, " * 50_000 + b"1.0]}}"  # ~250 kB, no Content-Length
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + body
    with fake_http.serve(reply) as (url, _):
        with pytest.raises(RewardError, match="more than 102400 bytes"):
            RemoteReward(url, timeout=2, retries=0, name="r", max_reply_mb=0.09765625)(IMGS, ["a", "b"])


def test_the_token_never_travels_and_an_impostor_reply_is_refused(monkeypatch, fake_http):
    """A process that took the port (e.g. while the reward server restarts) gets no token and cannot supply scores
    (issue 31 item 7): before the fix it received 'Authorization: Bearer <token>' and its scores were trained on."""
    reply = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [1.0, 2.0]}})
    with fake_http.serve(reply) as (url, heads):
        RemoteReward(url, timeout=2, retries=0, name="r")(IMGS, ["a", "b"])  # no token: no authentication
        monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
        client = RemoteReward(url, timeout=2, retries=2, name="r")
        with pytest.raises(RewardError, match="not authenticated .no X-MMGRPO-Reply-Auth.*does not hold the same token"):
            client(IMGS, ["a", "b"])
        assert client.last_attempts == 1  # a failed call (the trainer's retries / on_failure apply), not a retry loop
        dropping = ResilientReward(client, "r", retries=1, backoff=0.0, on_failure="drop")
        assert dropping.evaluate(IMGS, ["a", "b"])["valid"].tolist() == [False, False]
    assert b"authorization" not in heads[0].lower() and b"x-mmgrpo-auth" not in heads[0].lower()
    assert all(b"s3cret" not in h for h in heads) and all(b"\r\nx-mmgrpo-auth: v1 t=" in h.lower() for h in heads[1:])
    assert "s3cret" not in repr(RemoteReward(url))
    forged = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [1.0, 2.0]}},
                             extra_headers=b"X-MMGRPO-Reply-Auth: v1 m=" + b"0" * 64 + b"\r\n")
    with fake_http.serve(forged) as (url, _):
        with pytest.raises(RewardError, match="not authenticated .a wrong X-MMGRPO-Reply-Auth"):
            RemoteReward(url, timeout=2, retries=0, name="r")(IMGS, ["a", "b"])


def test_redirects_are_never_followed(monkeypatch, fake_http):
    """A 302 is a failed call: nothing is sent to the new location (issue 31 item 17; before the fix the client
    followed it with its bearer token and trained on that reply)."""
    monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
    good = fake_http.reply({"reward": "r", "n": 2, "scores": {"r": [1.0, 2.0]}})
    with fake_http.serve(good) as (elsewhere, seen_elsewhere):
        redirect = (f"HTTP/1.1 302 Found\r\nLocation: {elsewhere}\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n").encode()
        with fake_http.serve(redirect) as (url, _):
            client = RemoteReward(url, timeout=2, retries=2, name="r")
            with pytest.raises(RewardError, match=f"HTTP 302 redirecting to '{elsewhere}': redirects are never "
                                                  "followed"):
                client(IMGS, ["a", "b"])
            assert client.last_attempts == 1
        assert seen_elsewhere == []


# ----------------------------------------------------------------------------------------------- server
def _mean_reward(images, prompts, metadata, **kw):
    return {"mean": images.reshape(images.shape[0], -1).mean(1)}


@contextmanager
def running_server(**kw):
    srv = make_server(_mean_reward, "127.0.0.1", 0, **kw)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(2)


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict]:
    """Send ``head`` (request line + headers, no blank line) and ``body``; return (status, JSON reply)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    assert data, "the server closed the connection without an answer"
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2] or b"{}")


def _post_head(port, length, extra=""):
    cl = "" if length is None else f"Content-Length: {length}\r\n"
    return (f"POST /score HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{cl}"
            f"Connection: close{extra}")


def _good_body(n=2):
    return json.dumps({"images": encode_images(IMGS[:n], "png"), "prompts": ["a"] * n}).encode()


@pytest.mark.parametrize("length, status", [("abc", 400), ("-5", 400), ("1e3", 400), (None, 411), ("0", 400)])
def test_bad_content_length_gets_an_error_status(length, status):
    with running_server() as port:
        code, reply = raw_request(port, _post_head(port, length))
        assert code == status and "Content-Length" in reply["error"]
        assert raw_request(port, _post_head(port, len(_good_body())), _good_body())[0] == 200  # still serving


def test_oversized_request_is_refused_before_reading_it():
    with running_server(max_body_mb=1.0) as port:
        t0 = time.perf_counter()
        code, reply = raw_request(port, _post_head(port, 300 * 2**20))  # announces 300 MB, sends nothing
        assert code == 413 and "300.0 MB" in reply["error"] and "--max-body-mb" in reply["error"]
        assert time.perf_counter() - t0 < 2.0


def test_decoded_image_size_is_capped():
    big = np.zeros((1, 64, 64, 3), dtype=np.uint8)  # 4096 pixels: ~100 bytes as PNG
    body = json.dumps({"images": encode_images(big, "png"), "prompts": ["a"]}).encode()
    with running_server(max_megapixels=0.001) as port:
        code, reply = raw_request(port, _post_head(port, len(body)), body)
    assert code == 413 and "4096 pixels" in reply["error"]


def test_non_json_content_type_is_refused():
    body = _good_body()
    with running_server() as port:
        head = _post_head(port, len(body)).replace("application/json", "text/plain")
        code, reply = raw_request(port, head, body)
    assert code == 415 and "application/json" in reply["error"]


@pytest.mark.parametrize("host, ok", [("127.0.0.1:{port}", True), ("localhost:{port}", True), ("localhost", True),
                                      ("attacker.example:{port}", False), ("127.0.0.1.nip.io", False), (None, False)])
def test_host_header_is_checked(host, ok):
    body = _good_body()
    with running_server() as port:
        head = _post_head(port, len(body))
        head = head.replace(f"Host: 127.0.0.1:{port}\r\n", "" if host is None else f"Host: {host.format(port=port)}\r\n")
        code, reply = raw_request(port, head, body)
    assert (code == 200) == ok, reply
    if not ok:
        assert code == 400 and "Host" in reply["error"]


def test_extra_allowed_host():
    body = _good_body()
    with running_server(allowed_hosts=["reward-box"]) as port:
        head = _post_head(port, len(body)).replace(f"Host: 127.0.0.1:{port}", f"Host: reward-box:{port}")
        assert raw_request(port, head, body)[0] == 200


def test_token_authentication(monkeypatch):
    monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
    body = _good_body()
    with running_server() as port:
        code, reply = raw_request(port, _post_head(port, len(body)), body)
        assert code == 401 and "MMGRPO_REWARD_TOKEN" in reply["error"]
        code, _ = raw_request(port, _post_head(port, len(body), "\r\nAuthorization: Bearer s3cret"), body)
        assert code == 401  # the token in clear is not accepted: the token never travels
        assert raw_request(port, f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close")[0] == 401
        # the client reads the same variable: it signs; without it, it gets a clear refusal (not retried)
        url = f"http://127.0.0.1:{port}/score"
        assert RemoteReward(url, timeout=3, image_format="png", name="mean")(IMGS, ["a", "b"])["mean"].shape == (2,)
        monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "other")
        with pytest.raises(RewardError, match="HTTP 401.*wrong signature.*MMGRPO_REWARD_TOKEN differs"):
            RemoteReward(url, timeout=3, retries=2, name="mean")(IMGS, ["a", "b"])
        monkeypatch.delenv("MMGRPO_REWARD_TOKEN")
        client = RemoteReward(url, timeout=3, retries=2, name="mean")
        with pytest.raises(RewardError, match="HTTP 401.*set MMGRPO_REWARD_TOKEN"):
            client(IMGS, ["a", "b"])
        assert client.last_attempts == 1
    with running_server() as port:  # a server without the token: a client with one refuses its replies
        monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
        with pytest.raises(RewardError, match="not authenticated"):
            RemoteReward(f"http://127.0.0.1:{port}/score", timeout=3, retries=0, name="mean")(IMGS, ["a", "b"])


def _signed_post(port, body, token="s3cret", path="/score"):
    from mmgrpo.utils.http_guard import sign_request

    auth, nonce = sign_request(token, "POST", path, body)
    return _post_head(port, len(body), f"\r\nX-MMGRPO-Auth: {auth}"), nonce


def test_signed_requests_cannot_be_replayed_or_altered(monkeypatch):
    """What an impostor captures (a signed request) is worth nothing: the same bytes again are refused, another body
    under the captured headers too."""
    monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
    body = _good_body()
    with running_server() as port:
        head, _ = _signed_post(port, body)
        assert raw_request(port, head, body)[0] == 200
        code, reply = raw_request(port, head, body)
        assert code == 401 and "replayed" in reply["error"]
        head, _ = _signed_post(port, body)
        other = _good_body().replace(b'"a"', b'"b"')
        code, reply = raw_request(port, head.replace(f"Content-Length: {len(body)}", f"Content-Length: {len(other)}"),
                                  other)
        assert code == 401 and "does not match its signed hash" in reply["error"]
        head, _ = _signed_post(port, body, path="/health")  # signed for another path
        assert raw_request(port, head, body)[0] == 401
        from mmgrpo.utils.http_guard import sign_request

        auth, _ = sign_request("s3cret", "POST", "/score", body, now=time.time() - 3600)  # an old capture
        code, reply = raw_request(port, _post_head(port, len(body), f"\r\nX-MMGRPO-Auth: {auth}"), body)
        assert code == 401 and "away from the server's clock" in reply["error"]


def _reward_server_process(tmp_path, fd_limit):
    """The reference server in its own process with at most ``fd_limit`` open files (a small stand-in for the usual
    1,024): returns (process, port)."""
    import subprocess
    import sys

    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
            "from flow_grpo.rewards.server import main; sys.exit(main(sys.argv[1:]))" % (fd_limit, fd_limit))
    proc = subprocess.Popen([sys.executable, "-c", code, "--reward", "jpeg_compressibility", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert line.startswith("LISTENING"), line
    return proc, int(line.rsplit(":", 1)[1])


def _open_idle(port, n):
    """Up to ``n`` connections that send nothing (bounded: each connect may take 1 s at most)."""
    idle = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        idle.append(s)
    return idle


def _closed_by_server(socks, wait=0.5):
    n = 0
    for s in socks:
        s.settimeout(wait)
        try:
            n += s.recv(1) == b""
        except socket.timeout:
            pass
        except OSError:  # reset: closed too
            n += 1
    return n


@pytest.mark.timeout(60)
def test_idle_connections_do_not_lock_out_a_real_client(tmp_path):
    """400 connections that send nothing, against the server (default settings) limited to 256 open files: a real
    call still gets its scores at once (issue 31 item 6; before the fix each idle connection held a file and a
    thread until the limit, and the real client timed out)."""
    proc, port = _reward_server_process(tmp_path, 256)
    idle = []
    try:
        idle = _open_idle(port, 400)
        t0 = time.perf_counter()
        out = RemoteReward(f"http://127.0.0.1:{port}/score", timeout=5, retries=0, image_format="png",
                           name="jpeg_compressibility")(IMGS, ["a", "b"])
        assert out["jpeg_compressibility"].shape == (2,)
        assert time.perf_counter() - t0 < 3.0
        assert _closed_by_server(idle, 0.01) >= len(idle) - 64  # the oldest were evicted (--max-connections 64)
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait(5)


def test_idle_and_trickling_connections_are_closed_after_the_read_timeout():
    body = _good_body()
    with running_server(read_timeout=0.5, max_connections=8) as port:
        idle = _open_idle(port, 5)
        trickle = socket.create_connection(("127.0.0.1", port), timeout=3)
        head = _post_head(port, len(body)).encode() + b"\r\n\r\n"
        t0 = time.perf_counter()
        for i in range(12):  # one byte every 0.1 s: each read is quick, the request never completes in time
            try:
                trickle.sendall(head[i:i + 1])
            except OSError:
                break
            time.sleep(0.1)
        assert _closed_by_server(idle + [trickle], 1.0) == 6
        assert time.perf_counter() - t0 < 2.5
        assert raw_request(port, _post_head(port, len(body)), body)[0] == 200  # still serving
        for s in idle + [trickle]:
            s.close()


def test_dropped_call_is_not_reported_as_non_finite(caplog):
    """A failed call dropped with valid=False is logged as such once, not again as 'non-finite scores'."""
    from flow_grpo.rewards.base import check_finite_numpy

    with caplog.at_level("WARNING", logger="flow_grpo.rewards.base"):
        out = check_finite_numpy({"r": np.zeros(3), "valid": np.array([False, False, True])}, 3, "r", "drop")
        assert out["valid"].tolist() == [False, False, True] and "non-finite" not in caplog.text
        out = check_finite_numpy({"r": np.array([0.0, np.nan, np.nan]), "valid": np.array([False, True, True])},
                                 3, "r", "drop")
    assert out["valid"].tolist() == [False, False, False] and "2/3 samples have non-finite scores" in caplog.text
