status = "broken"
