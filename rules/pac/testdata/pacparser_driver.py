#!/usr/bin/python3
"""Drive Debian's python3-pacparser for kl's PAC tests and benchmarks.

Usage:
  pacparser_driver.py eval   < request.json    # {"script": S, "url": U, "host": H, "myip": IP}
                                               # prints the raw FindProxyForURL result
  pacparser_driver.py many   < request.json    # {"script": S, "calls": [[U, H], ...], "myip": IP}
                                               # prints one raw result per line
  pacparser_driver.py bench SCRIPT N HOST...   # evaluates N calls round-robin over HOSTs
                                               # prints "calls_per_sec ns_per_call"
"""
import json
import sys
import time

import pacparser


def main():
    mode = sys.argv[1]
    pacparser.init()
    pacparser.enable_microsoft_extensions()
    if mode == "eval":
        req = json.load(sys.stdin)
        if req.get("myip"):
            pacparser.setmyip(req["myip"])
        pacparser.parse_pac_string(req["script"])
        sys.stdout.write(pacparser.find_proxy(req["url"], req["host"]))
    elif mode == "many":
        req = json.load(sys.stdin)
        if req.get("myip"):
            pacparser.setmyip(req["myip"])
        pacparser.parse_pac_string(req["script"])
        for u, h in req["calls"]:
            sys.stdout.write(pacparser.find_proxy(u, h) + "\n")
    elif mode == "bench":
        with open(sys.argv[2]) as f:
            pacparser.parse_pac_string(f.read())
        n = int(sys.argv[3])
        hosts = sys.argv[4:]
        urls = ["https://%s/" % h for h in hosts]
        pairs = list(zip(urls, hosts))
        for u, h in pairs:  # warm up
            pacparser.find_proxy(u, h)
        find = pacparser.find_proxy
        m = len(pairs)
        start = time.perf_counter()
        for i in range(n):
            u, h = pairs[i % m]
            find(u, h)
        el = time.perf_counter() - start
        print("%f %f" % (n / el, el / n * 1e9))
    else:
        raise SystemExit("unknown mode " + mode)
    pacparser.cleanup()


if __name__ == "__main__":
    main()
