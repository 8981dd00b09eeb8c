// How Catch2 prints a boost::system::result<T, E>: boost's own operator<< is unconstrained and
// breaks Catch2 for a T without one.
#pragma once

#include <boost/system/result.hpp>
#include <catch2/catch.hpp>

#include <string>

template <class T, class E>
struct Catch::StringMaker<boost::system::result<T, E>> {
  static std::string convert(const boost::system::result<T, E>& r) {
    return r ? "result(value)" : "result(error)";
  }
};
