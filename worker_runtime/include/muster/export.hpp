// MUSTER_API marks what libmuster.so exports: the classes and functions of
// its public headers. Everything else in the library (its store client, the
// Boost.Asio it is built with, its internals) is hidden, so a program that
// links its own Boost or its own copy of muster's code never binds to ours,
// nor ours to its.
#pragma once

#if defined(__GNUC__)
#define MUSTER_API __attribute__((visibility("default")))
#else
#define MUSTER_API
#endif

// For libmuster's own classes that a public class names (its Impl): they stay
// inside the library even though the class that holds them is exported.
#if defined(__GNUC__)
#define MUSTER_HIDDEN __attribute__((visibility("hidden")))
#else
#define MUSTER_HIDDEN
#endif
