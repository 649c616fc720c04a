#!/usr/bin/python3
"""Drive Debian's python3-pacparser for kl's PAC tests and benchmarks.

Usage:
  pacparser_driver.py eval   < request.json    # {"script": S, "url": U, "host": H, "myip": IP}
                                               # prints the raw FindProxyForURL result
  pacparser_driver.py many   < request.json    # {"script": S, "calls": [[U, H], ...], "myip": IP}
                                               # prints one raw result per line
  pacparser_driver.py bench SCRIPT N HOSTFILE  # evaluates N calls round-robin over the hosts
                                               # prints "wall_ns_per_call cpu_ns_per_call"
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
        with open(sys.argv[4]) as f:
            hosts = f.read().split()
        urls = ["https://%s/" % h for h in hosts]
        pairs = list(zip(urls, hosts))
        for u, h in pairs:  # warm up
            pacparser.find_proxy(u, h)
        find = pacparser.find_proxy
        m = len(pairs)
        start, cstart = time.perf_counter(), time.process_time()
        for i in range(n):
            u, h = pairs[i % m]
            find(u, h)
        el, cel = time.perf_counter() - start, time.process_time() - cstart
        print("%f %f" % (el / n * 1e9, cel / n * 1e9))
    else:
        raise SystemExit("unknown mode " + mode)
    pacparser.cleanup()


if __name__ == "__main__":
    main()
