"""The small modules every room of the desktop package may use (architecture.md §1): the
version (`version.py`), the SDK's exceptions, one per stable error code (`exceptions.py`;
`import rbroker` shows them), child processes that end with their parent (`children.py`),
CUDA device numbering (`cuda.py`), process start times (`proctime.py`), the event loop a
broker runs on (`eventloop.py`), the checks a broker makes of its paths at start
(`startup.py`), how numbers and names are written for a person (`display.py`), wall-clock
times and durations as people type and read them (`when.py`) and a day of bookings drawn
for a terminal (`timeline.py`). They import nothing of the other rooms; importing this
package costs nothing."""
