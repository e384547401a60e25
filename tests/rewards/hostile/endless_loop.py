"""Never ends, never sleeps."""

while True:
    pass
