# attnplan_module(NAME [DEPS...]): a static library attnplan_NAME over runtime/NAME/*.cpp.
# Headers are included as "NAME/file.hpp" relative to runtime/, templates as "attnplan/params.h". An install
# puts runtime/NAME/ under include/attnplan/NAME/ and templates/attnplan/ under include/attnplan/, so the
# installed targets carry include/attnplan (for "NAME/...") and include (for "attnplan/...").
include(GNUInstallDirs)
set(ATTNPLAN_MODULE_INCLUDE_DIRS
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/runtime>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/templates>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/attnplan>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

function(attnplan_module name)
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/runtime/${name}/*.cpp)
  if(NOT sources)
    # A module with headers only (or none yet) still gives dependents its include path and deps.
    add_library(attnplan_${name} INTERFACE)
    target_include_directories(attnplan_${name} INTERFACE ${ATTNPLAN_MODULE_INCLUDE_DIRS})
    foreach(dep IN LISTS ARGN)
      target_link_libraries(attnplan_${name} INTERFACE attnplan_${dep})
    endforeach()
    return()
  endif()
  add_library(attnplan_${name} STATIC ${sources})
  target_include_directories(attnplan_${name} PUBLIC ${ATTNPLAN_MODULE_INCLUDE_DIRS})
  target_compile_options(attnplan_${name} PRIVATE ${ATTNPLAN_WARNINGS})
  set_target_properties(attnplan_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  foreach(dep IN LISTS ARGN)
    target_link_libraries(attnplan_${name} PUBLIC attnplan_${dep})
  endforeach()
endfunction()
