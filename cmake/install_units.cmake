# Runs at install time (install(CODE) in packaging/CMakeLists.txt): writes the
# systemd units with the binaries' and docs' paths under the prefix of that
# install (`cmake --install --prefix`, CPack's /usr), then installs them.
# In: MUSTER_UNIT_SOURCES (the units as written, naming /usr/bin and
# /usr/share/doc/muster), MUSTER_UNIT_BINDIR and MUSTER_UNIT_DOCDIR (as
# GNUInstallDirs gives them, relative to the prefix or absolute), MUSTER_UNIT_STAGE
# (a folder in the build tree).
foreach(dir BINDIR DOCDIR)
  set(full ${MUSTER_UNIT_${dir}})
  if(NOT IS_ABSOLUTE "${full}")
    set(full "${CMAKE_INSTALL_PREFIX}/${full}")
  endif()
  set(full_${dir} ${full})
endforeach()
foreach(source IN LISTS MUSTER_UNIT_SOURCES)
  get_filename_component(unit ${source} NAME)
  file(READ ${source} text)
  string(REPLACE "/usr/bin/" "${full_BINDIR}/" text "${text}")
  string(REPLACE "/usr/share/doc/muster/" "${full_DOCDIR}/" text "${text}")
  file(WRITE ${MUSTER_UNIT_STAGE}/${unit} "${text}")
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE FILES ${MUSTER_UNIT_STAGE}/${unit})
endforeach()
