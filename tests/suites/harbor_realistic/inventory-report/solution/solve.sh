#!/bin/bash
set -e
cat > /app/tools/report.py <<'PY'
#!/usr/bin/env python3
import json

items = json.load(open("/app/inventory.json"))
for name in sorted(items):
    item = items[name]
    if item["quantity"] == 0:
        print(f"{name}: out of stock")
        continue
    print(f"{name}: {item['quantity']} in stock, {item['price'] * item['quantity']:.2f} total")
PY
/app/tools/report.py > /app/report.txt
