"""The classifier benchmark's peer: Yelp's detect-secrets scanning one file.

Usage: bench_detect_secrets.py FILE [--repeat N]

Times only the scan (the import and plugin set-up are excluded, as the Rust side excludes
building its classifier), with detect-secrets' default plugins and filters, and prints
`mbps <median MB/s> findings <count>`. Install the peer with `pip install detect-secrets`.
"""

import argparse
import os
import statistics
import sys
import time

try:
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings
except ImportError:
    sys.exit("detect-secrets is not installed: pip install detect-secrets")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = os.path.getsize(args.file)
    rates = []
    findings = 0
    with default_settings():
        for _ in range(max(1, args.repeat)):
            collection = SecretsCollection()
            start = time.perf_counter()
            collection.scan_file(args.file)
            elapsed = time.perf_counter() - start
            rates.append(size / elapsed / 1e6)
            findings = sum(len(found) for _, found in collection.data.items())
    print(f"mbps {statistics.median(rates):.3f} findings {findings}")


if __name__ == "__main__":
    main()
