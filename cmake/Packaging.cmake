# Installing and packaging: `cmake --install` and the Debian package built by CPack
# (`cpack -G DEB`, or the `package` target) put in place toolhostd, toolhostctl, the systemd units
# under systemd/, the sysusers.d snippet and a commented /etc/toolhost/toolhost.toml.
# Included before the targets are defined, since CMAKE_INSTALL_RPATH initializes their properties.

# Installed binaries carry no RPATH into this checkout's .deps/: a package gets V8 from its
# libnode108 dependency. A private install that must find .deps/ can set this explicitly.
set(TOOLHOST_INSTALL_RPATH "" CACHE STRING
    "RPATH of installed binaries (empty for packages; libnode108 then comes from Depends)")
set(CMAKE_INSTALL_RPATH "${TOOLHOST_INSTALL_RPATH}")

# Units, sysusers.d, the config and the README are written at install time, because their paths
# depend on the prefix being installed to (cpack installs with /usr; `cmake --install --prefix`
# with another): units name <prefix>/bin/toolhostd; the config goes to /etc for the prefix /usr,
# else <prefix>/etc.
set(TOOLHOST_SYSTEMD_SOURCE_DIR "${PROJECT_SOURCE_DIR}/systemd")
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/install-systemd.cmake" CONTENT [[
  set(_source "@TOOLHOST_SYSTEMD_SOURCE_DIR@")
  set(_staging "@PROJECT_BINARY_DIR@/systemd-install")
  if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(_sysconf "/etc")
  else()
    set(_sysconf "${CMAKE_INSTALL_PREFIX}/etc")
  endif()
  set(TOOLHOST_BINDIR "${CMAKE_INSTALL_PREFIX}/bin")
  set(TOOLHOST_CONFDIR "${_sysconf}/toolhost")
  set(TOOLHOST_DOCDIR "${CMAKE_INSTALL_PREFIX}/share/doc/toolhost")
  set(_readable OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

  # Units are expanded into a directory of their own per destination, so concurrent installs (the
  # tests, cpack) never share one.
  string(SHA1 _key "$ENV{DESTDIR}|${CMAKE_INSTALL_PREFIX}")
  set(_staging "${_staging}/${_key}")
  foreach(_scope system user)
    set(_from "${_source}")
    if(_scope STREQUAL "user")
      set(_from "${_source}/user")
    endif()
    configure_file("${_from}/toolhost.service.in" "${_staging}/${_scope}/toolhost.service" @ONLY)
    file(INSTALL "${_staging}/${_scope}/toolhost.service" "${_from}/toolhost.socket"
         DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/${_scope}" PERMISSIONS ${_readable})
  endforeach()
  file(INSTALL "${_source}/toolhost.sysusers" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/sysusers.d"
       RENAME toolhost.conf PERMISSIONS ${_readable})
  # An edited config is never overwritten by a later `cmake --install` (dpkg handles its conffile).
  if(EXISTS "$ENV{DESTDIR}${TOOLHOST_CONFDIR}/toolhost.toml")
    message(STATUS "Keeping: $ENV{DESTDIR}${TOOLHOST_CONFDIR}/toolhost.toml")
  else()
    file(INSTALL "${_source}/toolhost.toml"
         DESTINATION "${TOOLHOST_CONFDIR}" PERMISSIONS ${_readable})
  endif()
  file(INSTALL "${_source}/../README.md"
       DESTINATION "${TOOLHOST_DOCDIR}" PERMISSIONS ${_readable})
  file(REMOVE_RECURSE "${_staging}")
]] @ONLY)
install(SCRIPT "${PROJECT_BINARY_DIR}/install-systemd.cmake")

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "toolhost")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "toolhost maintainers <dev@toolhost.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "daemon that hosts the tools AI agents call")
set(CPACK_PACKAGE_DESCRIPTION "toolhostd keeps every tool as an immutable, content-addressed \
revision, runs sandboxed JavaScript tools in V8 isolates, and lets tool code reach the outside \
world only through capabilities a policy engine authorizes. Clients speak JSON-RPC 2.0 over a \
Unix socket; toolhostctl is the client. Ships systemd units with socket activation.")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES TRUE)
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")  # toolhost_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# Depends: dpkg-shlibdeps maps every library the binaries link to its Debian package. V8 unpacked
# into .deps/ (when apt cannot install libnode108 beside NodeSource's nodejs) belongs to no
# installed package, so its package is named here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(NOT V8_LIBRARY_DIR STREQUAL "/usr/lib/x86_64-linux-gnu")
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${V8_LIBRARY_DIR}")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libnode108")
endif()
# postinst runs systemd-sysusers and daemon-reload.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/systemd/debian/conffiles" "${PROJECT_SOURCE_DIR}/systemd/debian/postinst"
    "${PROJECT_SOURCE_DIR}/systemd/debian/prerm" "${PROJECT_SOURCE_DIR}/systemd/debian/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
# Packages land in the build directory's packages/, not beside the sources.
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
include(CPack)
