"""bench.httpcodec: each codec reads the same Binding answer and AdmissionReview (each row checks
what it read), one figure a codec and path."""

from __future__ import annotations

from bench import httpcodec


def test_every_codec_reads_both_messages_and_is_measured() -> None:
    figures = httpcodec.run(1, messages=20)
    assert [f.metric for f in figures] == [
        f"{codec}: {path}"
        for codec in ("gpuplace", "h11", "httptools")
        for path in ("Binding answer read", "admission read+framed")
    ]
    assert all(f.value > 0 and f.unit == "µs" for f in figures)
