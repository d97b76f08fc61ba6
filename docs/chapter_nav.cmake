# cmake -DSRC=<source root> -DHTML=<Doxygen html folder> -P docs/chapter_nav.cmake
#
# The docs target's step after Doxygen: each chapter's page ends with a footer linking the
# chapter before it and the chapter after it, by title, so a reader goes through the lessons
# without the side tree. The order is the one gen_pages.cmake gives the chapter list: the
# chapters/NN-name folders sorted by name, so a new chapter joins the chain by existing. The
# titles are the READMEs' first headings; the page names are Doxygen's for a Markdown file
# (md_ + the path, every character that is not a letter or digit written as '_').
#
# The footer goes at the end of the page's text block (the </div> before Doxygen's closing
# "<!-- contents -->" comment), marked, so a second run replaces it instead of adding one.
cmake_minimum_required(VERSION 3.24)

file(GLOB readmes RELATIVE ${SRC} ${SRC}/chapters/[0-9][0-9]-*/README.md)
list(SORT readmes)
set(pages "")
set(titles "")
foreach(r ${readmes})
  string(REGEX REPLACE "\\.md$" "" p "${r}")
  string(REGEX REPLACE "[^A-Za-z0-9]" "_" p "${p}")
  list(APPEND pages "md_${p}.html")
  file(STRINGS ${SRC}/${r} first REGEX "^# " LIMIT_COUNT 1 ENCODING UTF-8)
  string(REGEX REPLACE "^# +" "" t "${first}")
  string(REGEX REPLACE " *\\{#[^}]*\\} *$" "" t "${t}")
  string(REPLACE "`" "" t "${t}")
  string(REPLACE "&" "&amp;" t "${t}")
  string(REPLACE "<" "&lt;" t "${t}")
  string(REPLACE ">" "&gt;" t "${t}")
  string(REPLACE ";" "," t "${t}")   # a CMake list separator
  list(APPEND titles "${t}")
endforeach()

list(LENGTH pages n)
if(n EQUAL 0)
  message(FATAL_ERROR "docs: no chapters/NN-name/README.md under ${SRC}")
endif()
# the first chapter's "previous" is the chapter list, the last one's "next" the notes
list(PREPEND pages chapters.html)
list(PREPEND titles "All chapters")
list(APPEND pages notes.html)
list(APPEND titles "Notes")
set(begin "<!-- kv-chapter-nav -->")
set(end "<!-- /kv-chapter-nav -->")
foreach(i RANGE 1 ${n})
  list(GET pages ${i} page)
  if(NOT EXISTS ${HTML}/${page})
    message(FATAL_ERROR "docs: Doxygen wrote no ${page} (the page of ${SRC}/chapters: a renamed README?)")
  endif()
  math(EXPR i_prev "${i} - 1")
  math(EXPR i_next "${i} + 1")
  list(GET pages ${i_prev} p_prev)
  list(GET titles ${i_prev} t_prev)
  list(GET pages ${i_next} p_next)
  list(GET titles ${i_next} t_next)
  set(nav "${begin}<nav class=\"kv-chapter-nav\">")
  string(APPEND nav "<a class=\"kv-prev\" href=\"${p_prev}\" rel=\"prev\">&larr; ${t_prev}</a>")
  string(APPEND nav "<a class=\"kv-next\" href=\"${p_next}\" rel=\"next\">${t_next} &rarr;</a>")
  string(APPEND nav "</nav>${end}")

  file(READ ${HTML}/${page} text)
  string(FIND "${text}" "${begin}" at)
  if(at GREATER_EQUAL 0)
    string(FIND "${text}" "${end}" to)
    string(LENGTH "${end}" end_len)
    math(EXPR to "${to} + ${end_len}")
    string(SUBSTRING "${text}" 0 ${at} head)
    string(SUBSTRING "${text}" ${to} -1 tail)
    set(text "${head}${tail}")
  endif()
  # the end of the text block: the last </div> before Doxygen's "</div><!-- contents -->"
  string(FIND "${text}" "</div><!-- contents -->" at REVERSE)
  if(at GREATER 0)
    string(SUBSTRING "${text}" 0 ${at} head)
    string(FIND "${head}" "</div>" at REVERSE)
  endif()
  if(at LESS 0)
    message(FATAL_ERROR "docs: ${page} has no end of contents (Doxygen's <!-- contents --> comment) to put the chapter footer before")
  endif()
  string(SUBSTRING "${text}" 0 ${at} head)
  string(SUBSTRING "${text}" ${at} -1 tail)
  file(WRITE ${HTML}/${page} "${head}${nav}\n${tail}")
endforeach()
message(STATUS "docs: previous/next footers on the ${n} chapter pages")
