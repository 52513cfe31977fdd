#!/usr/bin/env python3
import json

items = json.load(open("/app/inventory.json"))
for name in sorted(items):
    item = items[name]
    unit_share = item["price"] / item["quantity"] * item["quantity"]
    print(f"{name}: {item['quantity']} in stock, {unit_share * item['quantity']:.2f} total")
