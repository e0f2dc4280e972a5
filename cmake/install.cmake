# Installation: `cmake --install <build> [--prefix P]` lays out
#   include/ot/*.h                          public headers (version.h generated)
#   lib/libot.so[.0.9], lib/libot_ep.so     the libraries (ot_ep when MPI was found)
#   lib/cmake/ops_transformer/              find_package(ops_transformer CONFIG): ops_transformer::ot, ::ot_ep
#   lib/pkgconfig/ops_transformer[_ep].pc   for non-CMake builds
#   bin/ot                                  the command-line tool
# and `cpack -G DEB` packs the same tree. The Python package's files are component `python`, left out
# of a plain install (python/setup.py installs that component into the package).
include(CMakePackageConfigHelpers)
set(OT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ops_transformer)

install(TARGETS ot EXPORT ops_transformer_targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(DIRECTORY include/ot DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/generated/include/ot/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ot COMPONENT dev)
install(EXPORT ops_transformer_targets NAMESPACE ops_transformer:: FILE ops_transformerTargets.cmake
        DESTINATION ${OT_CMAKE_DIR} COMPONENT dev)
if(OT_HAVE_EP)
  install(TARGETS ot_ep EXPORT ops_transformer_ep_targets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
  install(EXPORT ops_transformer_ep_targets NAMESPACE ops_transformer:: FILE ops_transformerEpTargets.cmake
          DESTINATION ${OT_CMAKE_DIR} COMPONENT dev)
endif()
if(TARGET ot_cli)
  install(TARGETS ot_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

configure_package_config_file(cmake/ops_transformerConfig.cmake.in ${CMAKE_BINARY_DIR}/ops_transformerConfig.cmake
                              INSTALL_DESTINATION ${OT_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same major.minor satisfies a request.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ops_transformerConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ops_transformerConfig.cmake ${CMAKE_BINARY_DIR}/ops_transformerConfigVersion.cmake
        DESTINATION ${OT_CMAKE_DIR} COMPONENT dev)

# The .pc files locate the prefix from their own folder (relocatable, like the CMake package).
file(RELATIVE_PATH OT_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
foreach(pc ops_transformer ops_transformer_ep)
  if(pc STREQUAL "ops_transformer_ep" AND NOT OT_HAVE_EP)
    continue()
  endif()
  configure_file(cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

# The Debian package: library, headers, CMake and pkg-config files, `ot`. Run-time dependencies come
# from dpkg-shlibdeps on the packed binaries; what a consumer's build needs is declared by hand.
set(CPACK_PACKAGE_NAME ops-transformer)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Fused CPU operators for Mixture-of-Experts and Gated DeltaNet layers")
set(CPACK_PACKAGE_CONTACT "ops-transformer developers <ops-transformer@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "g++ (>= 12), cmake (>= 3.22)")
if(OT_HAVE_EP)
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "${CPACK_DEBIAN_PACKAGE_RECOMMENDS}, libopenmpi-dev")
endif()
include(CPack)
