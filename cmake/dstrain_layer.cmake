# dstrain_add_layer(NAME SOURCES ... HEADERS ... LINKS ...)
# One static library per layer, exported as dstrain::dstrain_<name>. Headers are included as
# "<layer>/<file>.h" from the source tree and installed under include/dstrain/<layer>/.
function(dstrain_add_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;HEADERS;LINKS;PRIVATE_LINKS" ${ARGN})
  add_library(dstrain_${name} STATIC ${L_SOURCES})
  add_library(dstrain::dstrain_${name} ALIAS dstrain_${name})
  target_include_directories(dstrain_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/dstrain>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(dstrain_${name} PUBLIC ${L_LINKS} PRIVATE ${L_PRIVATE_LINKS} $<BUILD_INTERFACE:dstrain_warnings>)
  if(DSTRAIN_FUZZ AND name IN_LIST DSTRAIN_FUZZ_COVERAGE_LAYERS)
    target_compile_options(dstrain_${name} PRIVATE -fsanitize=fuzzer-no-link)  # see DSTRAIN_FUZZ_COVERAGE_LAYERS
  endif()
  install(TARGETS dstrain_${name} EXPORT dstrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  foreach(h ${L_HEADERS})
    get_filename_component(dir ${h} DIRECTORY)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/${dir})
    install(FILES ${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dstrain/${rel})
  endforeach()
endfunction()
