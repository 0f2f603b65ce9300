# Writes mpiddp's modulefiles for an installed prefix: <DIR>/mpiddp/<version> (Environment
# Modules, Tcl) and <DIR>/mpiddp/<version>.lua (Lmod).
# Run by `cmake --install` (PREFIX = the install prefix) and usable alone:
#   cmake -DPREFIX=/opt/mpiddp [-DDIR=...] [-DPREREQ="mpi/openmpi-4.1.5"] -P cmake/InstallModulefiles.cmake
# DIR defaults to $MPIDDP_MODULEFILES_DIR, else PREFIX/share/modulefiles; PREREQ (the modules that
# must be loaded first, e.g. the MPI mpiddp was built with) to $MPIDDP_MODULE_PREREQ, else none.
cmake_minimum_required(VERSION 3.18)
foreach(var PREFIX SOURCE_DIR MPIDDP_VERSION LIBDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "InstallModulefiles.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT DEFINED DIR)
  if(DEFINED ENV{MPIDDP_MODULEFILES_DIR} AND NOT "$ENV{MPIDDP_MODULEFILES_DIR}" STREQUAL "")
    set(DIR "$ENV{MPIDDP_MODULEFILES_DIR}")
  else()
    set(DIR "${PREFIX}/share/modulefiles")
  endif()
endif()
if(NOT DEFINED PREREQ)
  set(PREREQ "$ENV{MPIDDP_MODULE_PREREQ}")
endif()
set(MPIDDP_MODULE_PREREQ "${PREREQ}")
configure_file(${SOURCE_DIR}/modulefiles/mpiddp.tcl.in ${DIR}/mpiddp/${MPIDDP_VERSION} @ONLY)
configure_file(${SOURCE_DIR}/modulefiles/mpiddp.lua.in ${DIR}/mpiddp/${MPIDDP_VERSION}.lua @ONLY)
message(STATUS "Installing: ${DIR}/mpiddp/${MPIDDP_VERSION} and ${MPIDDP_VERSION}.lua (prefix ${PREFIX}, prerequisites: ${PREREQ})")
