// No C++ exception may reach Cython-generated code (it declares our functions as not
// throwing) or leave a thread's entry function (std::terminate): every place that calls
// into code that can throw goes through guarded(), so they all report alike.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace polyllama {

// Runs fn(); true when it returned, false when it threw, with the exception's message in
// err ("unknown C++ exception" for one that is no std::exception). fn passes its results
// out through what it captures.
template <class Fn>
bool guarded(std::string & err, Fn && fn) noexcept {
    try {
        std::forward<Fn>(fn)();
        return true;
    } catch (const std::exception & e) {
        err = e.what();
    } catch (...) {
        err = "unknown C++ exception";
    }
    return false;
}

}  // namespace polyllama
