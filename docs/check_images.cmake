# cmake -DHTML=<Doxygen html folder> -DFIGURES=<docs/figures> [-DCHROMIUM=<headless chromium>]
#       [-DSHOTS=<folder>] -P docs/check_images.cmake
#
# The docs target's last step: no rendered page shows a broken image.
#   0. The READMEs embed ../../docs/figures/NAME.svg, a path from their own folder, which
#      Doxygen (1.9) copies into the HTML unchanged, where it points outside html/. The
#      figures are copied into html/figures/ and the pages' paths rewritten to figures/NAME,
#      so the HTML folder stands alone.
#   1. Every <img src> and <object data> of every page names a file of the HTML folder that
#      is a PNG, GIF or JPEG by its signature, or an SVG (an <svg ...> element, closed). This
#      needs no browser and always runs.
#   2. With a headless Chromium (Debian: chromium or chromium-headless-shell), each chapter's
#      page is loaded by a probe page that lists every image the browser could not decode
#      (complete, natural width 0) and is screenshotted into SHOTS (not committed: a picture
#      of each chapter to look at). A broken image in either step fails the target.
cmake_minimum_required(VERSION 3.24)

file(GLOB pages ${HTML}/*.html)
file(GLOB figures ${FIGURES}/*.svg ${FIGURES}/*.png)
file(COPY ${figures} DESTINATION ${HTML}/figures)
foreach(page ${pages})
  file(READ ${page} text)
  string(REGEX REPLACE "(src|data)=\"(\\.\\./)+docs/figures/" "\\1=\"figures/" fixed "${text}")
  if(NOT fixed STREQUAL text)
    file(WRITE ${page} "${fixed}")
  endif()
endforeach()
set(bad "")
set(n_images 0)
foreach(page ${pages})
  file(READ ${page} text)
  string(REGEX MATCHALL "<img [^>]*src=\"[^\"]+\"|<object [^>]*data=\"[^\"]+\"" tags "${text}")
  foreach(tag ${tags})
    string(REGEX REPLACE ".*(src|data)=\"([^\"]+)\".*" "\\2" target "${tag}")
    if(target MATCHES "^(https?:|data:|mailto:)")
      continue()
    endif()
    string(REGEX REPLACE "[?#].*$" "" target "${target}")
    get_filename_component(file ${HTML}/${target} ABSOLUTE)
    math(EXPR n_images "${n_images} + 1")
    get_filename_component(name ${page} NAME)
    if(NOT EXISTS ${file} OR IS_DIRECTORY ${file})
      list(APPEND bad "${name}: ${target} does not exist")
      continue()
    endif()
    file(READ ${file} head LIMIT 8 HEX)
    if(head MATCHES "^89504e470d0a1a0a" OR head MATCHES "^47494638" OR head MATCHES "^ffd8ff")
      continue()
    endif()
    file(READ ${file} svg)
    if(NOT svg MATCHES "<svg[ >]" OR NOT svg MATCHES "</svg>[ \t\r\n]*$")
      list(APPEND bad "${name}: ${target} is neither a PNG, GIF, JPEG nor a whole SVG")
    endif()
  endforeach()
endforeach()
list(LENGTH pages n_pages)
if(n_pages EQUAL 0)
  message(FATAL_ERROR "docs: no HTML pages in ${HTML}")
endif()
if(bad)
  list(JOIN bad "\n  " lines)
  message(FATAL_ERROR "docs: broken images in the rendered pages:\n  ${lines}")
endif()
message(STATUS "docs: ${n_images} images on ${n_pages} pages, every one a file that parses")

if(NOT CHROMIUM)
  message(STATUS "docs: no headless Chromium (apt-get install chromium-headless-shell): "
                 "the pages were checked without a browser, no screenshots")
  return()
endif()

# The probe: the chapter page in an iframe; once it has loaded (and its images with it), the
# probe writes the sources of the images that did not decode into its own DOM, which
# --dump-dom prints.
file(MAKE_DIRECTORY ${SHOTS})
file(GLOB chapters ${HTML}/md_chapters_*README.html)
set(bad "")
foreach(page ${chapters})
  get_filename_component(name ${page} NAME_WE)
  string(REGEX REPLACE "^md_chapters_([0-9][0-9]).*" "ch\\1" short "${name}")
  set(probe ${HTML}/probe_${name}.html)
  file(WRITE ${probe} "<!DOCTYPE html><html><body><pre id=\"broken\">pending</pre>
<iframe id=\"f\" src=\"${name}.html\" width=\"1280\" height=\"800\"></iframe>
<script>
document.getElementById('f').onload = function () {
  var d = this.contentDocument, out = [];
  if (!d) { document.getElementById('broken').textContent = 'no access to the page'; return; }
  var imgs = d.querySelectorAll('img');
  for (var i = 0; i < imgs.length; i++)
    if (!imgs[i].complete || imgs[i].naturalWidth === 0) out.push(imgs[i].getAttribute('src'));
  document.getElementById('broken').textContent = 'images ' + imgs.length + ' broken ' + out.length + (out.length ? ': ' + out.join(' ') : '');
};
</script></body></html>
")
  execute_process(COMMAND ${CHROMIUM} --headless --no-sandbox --disable-gpu
                          --allow-file-access-from-files --virtual-time-budget=10000
                          --dump-dom file://${probe}
                  OUTPUT_VARIABLE dom ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 120)
  file(REMOVE ${probe})
  string(REGEX MATCH "images [0-9]+ broken [0-9]+[^<]*" found "${dom}")
  if(NOT rc EQUAL 0 OR found STREQUAL "")
    list(APPEND bad "${short}: the browser did not report (exit ${rc})")
  elseif(NOT found MATCHES "broken 0$")
    list(APPEND bad "${short}: ${found}")
  endif()
  execute_process(COMMAND ${CHROMIUM} --headless --no-sandbox --disable-gpu --hide-scrollbars
                          --window-size=1280,2400 --screenshot=${SHOTS}/${short}.png
                          file://${page}
                  OUTPUT_QUIET ERROR_QUIET TIMEOUT 120)
  message(STATUS "docs: ${short}: ${found}; screenshot ${SHOTS}/${short}.png")
endforeach()
if(bad)
  list(JOIN bad "\n  " lines)
  message(FATAL_ERROR "docs: the browser found broken images:\n  ${lines}")
endif()
