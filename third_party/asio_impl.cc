// Asio and Beast are compiled once, here (BOOST_ASIO_SEPARATE_COMPILATION), instead of in every
// translation unit that includes them.
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
