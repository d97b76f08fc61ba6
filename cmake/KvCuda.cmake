# kv_cuda_sources(<out_var> <file.cu>...)
#
# Real CUDA build: the .cu files as they are. Emulation build: for each foo.cu a generated
# foo.cu.cpp that #includes it, so the host C++ compiler builds the very same source
# (compilers treat the .cu suffix as a linker input, not as C++).
function(kv_cuda_sources out_var)
  set(result)
  foreach(src IN LISTS ARGN)
    get_filename_component(abs ${src} ABSOLUTE)
    if(KV_CUDA_MODE STREQUAL "emulation")
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
      set(wrapper ${PROJECT_BINARY_DIR}/emu-src/${rel}.cpp)
      file(CONFIGURE OUTPUT ${wrapper}
           CONTENT "/* generated: emulation build of ${rel} */\n#include \"${abs}\"\n")
      set_property(SOURCE ${wrapper} APPEND PROPERTY OBJECT_DEPENDS ${abs})
      list(APPEND result ${wrapper})
    else()
      list(APPEND result ${abs})
    endif()
  endforeach()
  set(${out_var} ${result} PARENT_SCOPE)
endfunction()
