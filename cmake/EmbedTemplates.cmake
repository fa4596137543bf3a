# attnplan_embed_templates(TARGET DIR): generates a source file that holds every header under DIR as a
# byte array and adds it to TARGET. The generated file is rebuilt whenever a header changes.
function(attnplan_embed_templates target dir)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${dir}/*.cuh ${dir}/*.h)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/embedded_templates.cpp)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DDIR=${dir} -DOUT=${out} -P ${PROJECT_SOURCE_DIR}/cmake/GenerateEmbeddedTemplates.cmake
    DEPENDS ${headers} ${PROJECT_SOURCE_DIR}/cmake/GenerateEmbeddedTemplates.cmake
    COMMENT "Embedding CUDA templates"
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
