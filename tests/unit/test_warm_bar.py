"""``shadefs warm``'s progress bar: bytes done, total and rate in binary units (KiB, MiB), as in every
other figure shadefs prints (tqdm's own unit_scale writes counts in 1024s with a bare "k" and the rate in
decimal kB/s)."""
import io
import re

from tqdm import tqdm

from shadefs.warm import BAR_FORMAT, _iec_bar


def _last_frame(out: io.StringIO) -> str:
    return [f for f in re.split(r"[\r\n]", out.getvalue()) if f.strip()][-1]


def test_the_warm_bar_gives_done_total_and_rate_in_binary_units():
    out = io.StringIO()
    bar = _iec_bar(tqdm)(total=3 * 2**20, desc="warm", bar_format=BAR_FORMAT, file=out, mininterval=0)
    bar.set_postfix(files="2/4", admitted=2, refresh=False)
    bar.update(1536 * 1024)
    frame = _last_frame(out)
    assert re.fullmatch(r"warm:  50%\|.*\| 1\.5 MiB/3\.0 MiB \[\d\d:\d\d<[\d:?]+, [\d.]+ (B|KiB|MiB|GiB|TiB)/s, "
                        r"admitted=2, files=2/4\]", frame), frame
    bar.close()
    assert "kB" not in out.getvalue() and not re.search(r"\d[kM]B?\b", out.getvalue()), out.getvalue()


def test_the_warm_bar_before_any_byte_says_so_in_words():
    out = io.StringIO()
    bar = _iec_bar(tqdm)(total=1000, desc="warm", bar_format=BAR_FORMAT, file=out, mininterval=0)
    bar.refresh()
    assert re.search(r"\| 0 B/1000 B \[.*\? B/s\]", _last_frame(out)), out.getvalue()
    bar.close()
