# Writes ${PTH_DIR}/ops_transformer.pth containing ${SRC}, so /usr/bin/python3 finds the package
# without PYTHONPATH. Never fails the build: an unwritable folder only prints a note.
if(NOT PTH_DIR)
  return()
endif()
execute_process(
  COMMAND /usr/bin/python3 -c "
import os, sys
d, src = sys.argv[1], sys.argv[2]
p = os.path.join(d, 'ops_transformer.pth')
try:
    if open(p).read() == src + '\\n': sys.exit(0)
except OSError: pass
try:
    os.makedirs(d, exist_ok=True)
    open(p + '.tmp', 'w').write(src + '\\n'); os.replace(p + '.tmp', p)
    print('ops_transformer: wrote', p)
except OSError as e:
    print('ops_transformer: cannot write', p, '(', e.strerror, '); use PYTHONPATH=' + src)
" "${PTH_DIR}" "${SRC}")
